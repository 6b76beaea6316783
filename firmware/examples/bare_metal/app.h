/* The example application's own services (startup.c, uart.c). */
#ifndef APP_H
#define APP_H

#include <stddef.h>
#include <stdint.h>

/* The component has Ethos-U models (CMakeLists.txt: APP_NPU); 0 where a build does not say. */
#ifndef APP_NPU
#define APP_NPU 0
#endif

#ifdef __cplusplus
extern "C" {
#endif

void console_init(void);
void console_putc(char c);
void console_puts(const char *s);
void console_hex(const void *data, uint32_t n);
void console_dec(uint32_t v);
void app_exit(int status) __attribute__((noreturn));
uint32_t app_stack_used(void);
/* APP_NPU: the NPU's IRQ enabled and dk_npu_init() called (startup.c); its status. */
int app_npu_start(void);

/* One model of the component as the application drives it (app_models.h lists them). */
typedef struct {
  const char *name;
  int (*init)(void);
  int (*init_with)(void *arena, size_t size);
  int (*run)(void);
  void *(*input)(int index);
  const void *(*output)(int index);
  int num_inputs;
  const void *const *input_data;
  const uint32_t *input_bytes;
  int num_outputs;
  const uint32_t *output_bytes;
  uint32_t arena_size;
} app_model_t;

#ifdef __cplusplus
}
#endif

#endif /* APP_H */
