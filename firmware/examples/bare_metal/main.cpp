// The example application in C++, compiled with -fno-exceptions -fno-rtti: the same runs as
// main.c through a small wrapper class, so that a C++ project's use of the component's C
// headers (extern "C", no exceptions, no RTTI, no C++ runtime support) is compiled and linked.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "app.h"
#include "app_models.h"

namespace {

class Model {
 public:
  explicit constexpr Model(const app_model_t &m) : m_(m) {}
  int init() const { return m_.init(); }
  int run() const {
    for (int i = 0; i < m_.num_inputs; ++i)
      std::memcpy(m_.input(i), m_.input_data[i], m_.input_bytes[i]);
    return m_.run();
  }
  void print_outputs() const {
    for (int i = 0; i < m_.num_outputs; ++i) {
      console_puts("out ");
      console_puts(m_.name);
      console_putc(' ');
      console_dec(static_cast<uint32_t>(i));
      console_putc(' ');
      console_hex(m_.output(i), m_.output_bytes[i]);
      console_putc('\n');
    }
  }
  const char *name() const { return m_.name; }

 private:
  const app_model_t &m_;
};

void report(const char *what, const char *model, int code) {
  console_puts(what);
  console_putc(' ');
  console_puts(model);
  console_putc(' ');
  console_dec(static_cast<uint32_t>(code));
  console_putc(' ');
  console_puts(dk_error_name(code));
  console_putc('\n');
}

}  // namespace

int main() {
  console_init();
  console_puts("app ");
  console_puts(dk_component_info);
  console_putc('\n');
  int failures = 0;
#if APP_NPU
  const int npu = app_npu_start();  // dk_npu_init() before the models' init
  report("init", "npu", npu);
  failures += npu != DK_OK;
#endif
  for (const app_model_t &m : app_models) {
    const Model model(m);
    const int status = model.init();
    report("init", model.name(), status);
    failures += status != DK_OK;
  }
  for (const app_model_t &m : app_models) {
    const Model model(m);
    if (failures) break;
    const int status = model.run();
    report("run", model.name(), status);
    failures += status != DK_OK;
    if (status == DK_OK) model.print_outputs();
  }
  console_puts("stack ");
  console_dec(app_stack_used());
  console_puts("\ndone ");
  console_dec(static_cast<uint32_t>(failures));
  console_putc('\n');
  return failures;
}
