/* The example application: runs every model of app_models.h (the component's headers and the
 * models' example inputs) once, one after the other, and prints each output as hex on the
 * UART; with APP_CHECKS it first checks the API's answers to misuse. The exit code (QEMU's, by
 * semihosting) is the number of failures.
 *
 * With APP_NPU it first brings the NPU up (app_npu_start: dk_npu_init()) and reports that as
 * the init of "npu".
 *
 * Lines: "check <what> <model> <code> <name>", "init <model> <code> <name>",
 * "run <model> <code> <name>", "out <model> <index> <hex bytes>", "stack <bytes>",
 * "done <failures>". */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "app.h"
#include "app_models.h"

#if APP_CHECKS
/* The first model runs in the application's own memory (init_with), the others in the
 * component's static arenas (init). */
static uint8_t app_arena[APP_FIRST_ARENA_SIZE] __attribute__((aligned(APP_FIRST_ARENA_ALIGN)));
#endif

static void report(const char *what, const char *model, int code) {
  console_puts(what);
  console_putc(' ');
  console_puts(model);
  console_putc(' ');
  console_dec((uint32_t)code);
  console_putc(' ');
  console_puts(dk_error_name(code));
  console_putc('\n');
}

int main(void) {
  int failures = 0;
  console_init();
  console_puts("app ");
  console_puts(dk_component_info);
  console_putc('\n');
#if APP_NPU
  /* Before the models' init; a model can be initialised without it, but its runs fail. */
  const int npu = app_npu_start();
  report("init", "npu", npu);
  if (npu != DK_OK) ++failures;
#endif
#if APP_CHECKS
  const app_model_t *first = &app_models[0];
  report("check run_before_init", first->name, first->run());
  report("check input_before_init", first->name, first->input(0) == NULL ? DK_OK : -1);
  report("check init_with_short", first->name,
         first->init_with(app_arena, sizeof app_arena - 1u));
  report("check init_with_null", first->name, first->init_with(NULL, sizeof app_arena));
  report("check run_after_failed_init", first->name, first->run());
#endif
  int ready[APP_NUM_MODELS];
  for (int m = 0; m < APP_NUM_MODELS; ++m) {
    const app_model_t *model = &app_models[m];
#if APP_CHECKS
    const int status = m == 0 ? model->init_with(app_arena, sizeof app_arena) : model->init();
#else
    const int status = model->init();
#endif
    report("init", model->name, status);
    ready[m] = status == DK_OK;
    if (status != DK_OK) ++failures;
  }
#if APP_CHECKS
  if (ready[0]) {
    /* A second init of the same model reloads it (its delegates' handles are given back). */
    const int status = first->init_with(app_arena, sizeof app_arena);
    report("check reinit", first->name, status);
    ready[0] = status == DK_OK;
  }
#endif
  for (int m = 0; m < APP_NUM_MODELS; ++m) {
    const app_model_t *model = &app_models[m];
    if (!ready[m]) continue;
    for (int i = 0; i < model->num_inputs; ++i)
      memcpy(model->input(i), model->input_data[i], model->input_bytes[i]);
    const int status = model->run();
    report("run", model->name, status);
    ready[m] = status == DK_OK;
    if (status != DK_OK) ++failures;
  }
  for (int m = 0; m < APP_NUM_MODELS; ++m) {
    const app_model_t *model = &app_models[m];
    if (!ready[m]) continue;
    for (int i = 0; i < model->num_outputs; ++i) {
      console_puts("out ");
      console_puts(model->name);
      console_putc(' ');
      console_dec((uint32_t)i);
      console_putc(' ');
      console_hex(model->output(i), model->output_bytes[i]);
      console_putc('\n');
    }
  }
  console_puts("stack ");
  console_dec(app_stack_used());
  console_puts("\ndone ");
  console_dec((uint32_t)failures);
  console_putc('\n');
  return failures;
}
