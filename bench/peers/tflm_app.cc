/*
 * tflm_app.cc: TensorFlow Lite Micro on deploykit's board support, for bench/peers.
 *
 * Runs one .tflite model once and reports through deploykit's result protocol, like the
 * ExecuTorch runner (firmware/runner/runner.cpp): hello, the output tensor, timing (only
 * Invoke(), on dk_ticks(), the clock the runner times execute() with), memory (the arena's
 * used bytes, the stack and heap high-water marks), done. The generated peer_model.h (written
 * by bench/peers/run) gives the model's bytes, the arena size and PEER_REGISTER_OPS, which
 * registers exactly the model's operators with their int8-only CMSIS-NN kernels.
 */
#include <stddef.h>
#include <stdint.h>

#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/schema/schema_generated.h"

#include "peer_model.h"

extern "C" {
#include "board_config.h"
#include "dk_board.h"
#include "dk_errors.h"
#include "dk_protocol.h"
}

// The arena where deploykit's runner has its memory pools (the board's `pools` region).
alignas(16) static uint8_t tensor_arena[PEER_ARENA_SIZE] __attribute__((section(".dk_pools")));

// The protocol's dtype codes, ExecuTorch's ScalarType (docs/protocol.md): Char, Float.
static constexpr uint8_t kProtocolInt8 = 1;
static constexpr uint8_t kProtocolFloat32 = 6;

[[noreturn]] static void fail(const char *what) {
  dk_send_error(DK_ERR_SELFTEST, what);
  dk_send_done(1);
  dk_exit(1);
}

int main() {
  dk_send_hello("protocol=1\nboard=" DK_BOARD_NAME "\nfirmware=tflite-micro\nmodel="
                PEER_MODEL_NAME);

  const tflite::Model *model = tflite::GetModel(peer_model_data);
  tflite::MicroMutableOpResolver<PEER_NUM_OPS> resolver;
  PEER_REGISTER_OPS(resolver);
  tflite::MicroInterpreter interpreter(model, resolver, tensor_arena, sizeof tensor_arena);
  if (interpreter.AllocateTensors() != kTfLiteOk) fail("AllocateTensors failed");

  // A fixed input pattern: CMSIS-NN's int8 kernels take the same path for any values. A model
  // with float input (a quantize first) gets the same pattern in [-1, 1).
  TfLiteTensor *input = interpreter.input(0);
  const size_t elements = input->bytes / (input->type == kTfLiteFloat32 ? 4u : 1u);
  for (size_t i = 0; i < elements; ++i) {
    const int value = static_cast<int>((i * 37u) % 255u) - 127;
    if (input->type == kTfLiteInt8)
      input->data.int8[i] = static_cast<int8_t>(value);
    else if (input->type == kTfLiteFloat32)
      input->data.f[i] = static_cast<float>(value) / 128.0f;
    else
      fail("the model's input is neither int8 nor float32");
  }

  const uint64_t t0 = dk_ticks();
  const TfLiteStatus status = interpreter.Invoke();
  const uint64_t ticks = dk_ticks() - t0;
  if (status != kTfLiteOk) fail("Invoke failed");

  const TfLiteTensor *output = interpreter.output(0);
  int32_t sizes[4] = {1, 1, 1, 1};
  const int dims = output->dims->size < 4 ? output->dims->size : 4;
  for (int i = 0; i < dims; ++i) sizes[i] = output->dims->data[i];
  const uint8_t dtype = output->type == kTfLiteFloat32 ? kProtocolFloat32 : kProtocolInt8;
  if (dk_send_tensor(0, dtype, static_cast<uint8_t>(dims), sizes, 0.0f, 0, output->data.raw,
                     static_cast<uint32_t>(output->bytes)) != 0)
    fail("tensor record refused by the encoder");
  dk_send_timing(ticks, dk_tick_hz(), 1, DK_INSTRUCTIONS_UNKNOWN);
  const dk_memory_entry_t entries[] = {
      {"arena", static_cast<uint32_t>(interpreter.arena_used_bytes()), PEER_ARENA_SIZE},
      {"stack", static_cast<uint32_t>(dk_stack_used()), static_cast<uint32_t>(dk_stack_size())},
      {"heap", static_cast<uint32_t>(dk_heap_used()), static_cast<uint32_t>(dk_heap_size())},
  };
  if (dk_send_memory(entries, sizeof entries / sizeof entries[0]) != 0)
    fail("memory record refused by the encoder");
  dk_send_done(0);
  dk_exit(0);
}

// TFLM's platform hooks (what its cortex_m_generic target supplies): no log output, since
// the release build strips the error strings, and the board's tick counter as its clock.
extern "C" void DebugLog(const char *, va_list) {}
extern "C" int DebugVsnprintf(char *buffer, size_t buf_size, const char *, va_list) {
  if (buf_size) buffer[0] = '\0';
  return 0;
}
namespace tflite {
uint32_t ticks_per_second() { return dk_tick_hz(); }
uint32_t GetCurrentTimeTicks() { return static_cast<uint32_t>(dk_ticks()); }
}  // namespace tflite
