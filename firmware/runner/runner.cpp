/*
 * runner.cpp: the deploykit ExecuTorch runner firmware.
 *
 * Loads the embedded .pte (model_pte.h) with Program::load over a BufferDataLoader, loads its
 * first method with static pools sized by the generated model_config.h, sets the inputs from
 * model_io.h, executes once (timed with dk_ticks()) and reports everything through the result
 * protocol (docs/protocol.md): hello, one tensor record per output, timing, memory, done.
 * Any ExecuTorch error becomes an `error` record (the Error code and a message), then
 * done(1) and exit. No printf, no heap. A failed execute() is first placed by an `execute_error`
 * record: the instruction it stopped at (counted by the temp allocator's resets) and the
 * CMSIS-NN call that refused, if one did (kernel_status.h).
 *
 * Tensor bytes are in each tensor's memory order (its dim order in the program, e.g.
 * channels-last NHWC for a cortex_m model's 4-D input), with logical sizes: dk_input_sets[][] are
 * rendered that way (deploykit's memory_order_bytes), outputs are sent as they lie in memory
 * and the host brings them back to logical order.
 *
 * Error codes of the `error` record: ExecuTorch Error values (< 0x100), or deploykit's codes
 * (dk_errors.h, generated from tools/deploykit/readers/protocol/errors.yaml); the host names both.
 *
 * Ethos-U firmware (DK_ETHOS_U=1, npu_ethos_u.cpp): the NPU is checked and initialised right
 * after hello (an absent NPU is an error record and done(1), before anything runs); the temp
 * pool, from which EthosUBackend takes the Vela scratch, grows by DK_NPU_SCRATCH_SIZE and moves
 * to section .dk_npu_scratch (the region the memory mode needs); every delegate call is
 * reported in an `npu` record after the outputs.
 *
 * Profiling firmware (DK_PROFILE_EVENTS=1, event_tracer.cpp; deploykit profile and run
 * --debug-intermediates): the method runs with deploykit's streaming EventTracer, which sends
 * each operator's event (and, with DK_TRACE_INTERMEDIATES, its output tensors) as it happens; a
 * `trace_summary` record follows `timing`. Without it this file compiles to what it always did.
 *
 * Serve firmware (DK_SERVE=1, deploykit's api.stream; docs/firmware.md "Serve firmware"): no
 * embedded inputs run; after loading the method it sends a `ready` record and serves samples
 * the host sends as host frames on the console (docs/protocol.md "Host -> device", parser
 * ../protocol/dk_stream.c): each `run` executes the inputs received and answers with the
 * outputs and a `sample_done`; `end` sends the totals (timing, memory) and done. A failed
 * execute() or a rejected frame is reported and the firmware serves on.
 */
#include <stddef.h>
#include <stdint.h>

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/core/span.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/method_meta.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include "board_config.h"
#include "dk_board.h"
#include "dk_protocol.h"
#include "model_config.h"
#include "model_io.h"
#include "model_pte.h"
#include "dk_errors.h"
#include "kernel_status.h"
#include "text.h"
#if DK_ETHOS_U
#include "npu.h"
#endif
#if DK_PROFILE_EVENTS
#include "event_tracer.h"
#endif
#if DK_SERVE
#include "dk_stream.h"
#endif

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::extension::BufferDataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::MemoryAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Span;
using executorch::runtime::TensorInfo;

#ifndef DK_ETHOS_U
#define DK_ETHOS_U 0
#endif
#ifndef DK_PROFILE_EVENTS
#define DK_PROFILE_EVENTS 0
#endif
#ifndef DK_SERVE
#define DK_SERVE 0
#endif
#if DK_SERVE && DK_PROFILE_EVENTS
#error "serve firmware (DK_SERVE) is not built with the profiling tracer (DK_PROFILE_EVENTS)"
#endif

#ifndef DK_ET_RUNTIME_KEY
#define DK_ET_RUNTIME_KEY "unknown"
#endif
#ifndef DK_MAX_KERNEL_NUM
#define DK_MAX_KERNEL_NUM 0
#endif
#ifndef DK_INPUTS_SHA256
#define DK_INPUTS_SHA256 "unknown"
#endif

namespace {

/* A bump allocator that remembers its high-water mark (the temp allocator is reset after every
 * kernel, so its peak is only visible here) and the first request it could not satisfy. In
 * Ethos-U firmware, requests made inside a delegate call (EthosUBackend's Vela scratch) count
 * towards a high-water mark of their own.
 *
 * It also counts its resets: Method::execute() resets the temp allocator once as it starts and
 * once after every instruction it runs, the failing one included, and not after a failure. So
 * after a failed execute() the count says which instruction failed (failed_step), with no
 * hook in ExecuTorch and 4 bytes of RAM. */
class CountingAllocator : public MemoryAllocator {
 public:
  CountingAllocator(uint32_t size, uint8_t *base) : MemoryAllocator(size, base) {}
  void *allocate(size_t size, size_t alignment = kDefaultAlignment) override {
    void *p = MemoryAllocator::allocate(size, alignment);
    if (p == nullptr) {
      if (failed_request_ == 0) failed_request_ = size;
      return nullptr;
    }
    const size_t used = used_size();
#if DK_ETHOS_U
    if (dk_npu_in_delegate()) {
      if (used > npu_high_water_) npu_high_water_ = used;
      return p;
    }
#endif
    if (used > high_water_) high_water_ = used;
    return p;
  }
  void reset() override {
    ++resets_;
    MemoryAllocator::reset();
  }
  void count_resets() { resets_ = 0; }
  /* The instructions run before the one that failed, or DK_EXECUTE_STEP_NONE when execute()
   * failed before its first instruction. */
  uint32_t failed_step() const { return resets_ >= 2u ? resets_ - 2u : DK_EXECUTE_STEP_NONE; }
  size_t high_water() const { return high_water_; }
  size_t npu_high_water() const { return npu_high_water_; }
  size_t failed_request() const { return failed_request_; }

 private:
  size_t high_water_ = 0;
  size_t npu_high_water_ = 0;
  size_t failed_request_ = 0;
  uint32_t resets_ = 0;
};

/* ---- pools (section .dk_pools: the board's `pools` region, not zeroed at start-up; a family
 * without a linker script of its own, such as linux_aarch64, defines DK_POOL_ATTR) ---- */
#ifndef DK_POOL_ATTR
#define DK_POOL_ATTR __attribute__((section(".dk_pools"), aligned(16)))
#endif
/* A zero-sized pool still needs an object; it is never handed out. */
#define DK_POOL_BYTES(n) ((n) > 0u ? (n) : 16u)

DK_POOL_ATTR uint8_t method_pool[DK_POOL_BYTES(DK_METHOD_POOL_SIZE)];
#if DK_ETHOS_U
/* EthosUBackend takes the Vela scratch from the temp allocator: one block of the CPU kernels'
 * temp pool plus the scratch, in .dk_npu_scratch (the region the Vela memory mode puts the
 * scratch in, memory.ld), on a cache line. */
constexpr uint32_t kTempPoolBytes = DK_TEMP_POOL_SIZE + DK_NPU_SCRATCH_SIZE;
__attribute__((section(".dk_npu_scratch"), aligned(32)))
uint8_t temp_pool[DK_POOL_BYTES(kTempPoolBytes)];
#else
constexpr uint32_t kTempPoolBytes = DK_TEMP_POOL_SIZE;
DK_POOL_ATTR uint8_t temp_pool[DK_POOL_BYTES(kTempPoolBytes)];
#endif

constexpr uint32_t kPlannedSizes[] = DK_PLANNED_BUFFER_SIZES;
constexpr size_t kPlannedCount = DK_PLANNED_BUFFER_COUNT;
constexpr size_t planned_total() {
  size_t t = 0;
  for (size_t i = 0; i < kPlannedCount; ++i) t += (kPlannedSizes[i] + 15u) & ~size_t(15u);
  return t;
}
DK_POOL_ATTR uint8_t planned_pool[DK_POOL_BYTES(planned_total())];

CountingAllocator method_allocator(DK_METHOD_POOL_SIZE, method_pool);
CountingAllocator temp_allocator(kTempPoolBytes, kTempPoolBytes > 0u ? temp_pool : nullptr);

size_t planned_used = 0;

/* ---- reporting ---- */
[[noreturn]] void finish(uint32_t status) {
  dk_send_done(status);
  dk_exit(static_cast<int>(status));
}

[[noreturn]] void fail(uint32_t code, const char *what, uint32_t status = DK_STATUS_ET_ERROR) {
  dk_send_error(code, what);
  finish(status);
}

[[noreturn]] void fail_et(Error err, const char *what) {
  char buf[128];
  Text t(buf, sizeof buf);
  t << what << " failed";  // the host names the Error code (errors.yaml)
  fail(static_cast<uint32_t>(err), t.c_str());
}

void send_memory() {
  const dk_memory_entry_t entries[] = {
      {"method_pool", static_cast<uint32_t>(method_allocator.high_water()), DK_METHOD_POOL_SIZE},
      {"planned_pool", static_cast<uint32_t>(planned_used), static_cast<uint32_t>(planned_total())},
      {"temp_pool", static_cast<uint32_t>(temp_allocator.high_water()), DK_TEMP_POOL_SIZE},
      {"stack", static_cast<uint32_t>(dk_stack_used()), static_cast<uint32_t>(dk_stack_size())},
      {"heap", static_cast<uint32_t>(dk_heap_used()), static_cast<uint32_t>(dk_heap_size())},
#if DK_ETHOS_U
      {"npu_scratch", static_cast<uint32_t>(temp_allocator.npu_high_water()),
       DK_NPU_SCRATCH_SIZE},
#endif
  };
  if (dk_send_memory(entries, sizeof entries / sizeof entries[0]) != 0)
    fail(DK_ERR_SEND, "memory record refused by the encoder");
}

/* Before each execute(): the reset count and the kernel status start afresh. */
void execute_begins() {
  temp_allocator.count_resets();
  dk_kernel_failure_clear();
}

/* Where a failed execute() stopped: the execute_error record, sent before its error record. */
void send_execute_error(Error err) {
  dk_send_execute_error(static_cast<uint32_t>(err), temp_allocator.failed_step(),
                        dk_kernel_failure.status, dk_kernel_failure.call);
}

/* A pool ran out: its own code (the host reads the pool from it), and a message that says how
 * much was asked for. */
[[noreturn]] void fail_pool(uint32_t code, const char *pool, size_t capacity, size_t request) {
  char buf[160];
  Text t(buf, sizeof buf);
  t << pool << " too small: " << static_cast<uint32_t>(capacity) << " B, a request for "
    << static_cast<uint32_t>(request) << " B did not fit";
  send_memory();
  fail(code, t.c_str(), DK_STATUS_POOL_TOO_SMALL);
}

/* ---- inputs and outputs ---- */
bool protocol_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Byte:
    case ScalarType::Char:
    case ScalarType::Short:
    case ScalarType::Int:
    case ScalarType::Long:
    case ScalarType::Float:
    case ScalarType::Double:
    case ScalarType::Bool:
      return true;
    default:
      return false;
  }
}

#if !DK_SERVE  // serve firmware receives its inputs (serve_setup)
void set_inputs(Method &method, const MethodMeta &meta, size_t set) {
  if (meta.num_inputs() != DK_NUM_INPUTS) fail(DK_ERR_INPUT, "model_io.h: wrong number of inputs");
  for (size_t i = 0; i < DK_NUM_INPUTS; ++i) {
    const dk_tensor_data &in = dk_input_sets[set][i];
    Result<TensorInfo> info = meta.input_tensor_meta(i);
    if (!info.ok()) fail(DK_ERR_NOT_TENSOR, "input is not a tensor");
    Span<const int32_t> sizes = info->sizes();
    bool same = static_cast<uint8_t>(info->scalar_type()) == in.dtype && sizes.size() == in.ndim &&
                info->nbytes() == in.nbytes;
    for (size_t d = 0; same && d < sizes.size(); ++d) same = sizes[d] == in.sizes[d];
    if (!same) {
      char buf[96];
      Text t(buf, sizeof buf);
      t << "model_io.h: input " << static_cast<uint32_t>(i)
        << " differs from the program's (dtype, sizes or bytes)";
      fail(DK_ERR_INPUT, t.c_str());
    }
    // The bytes are already in the program's dim order: describe them with it. set_input
    // copies them into a memory-planned input, or lets the method use them in place.
    TensorImpl impl(info->scalar_type(), static_cast<ssize_t>(sizes.size()),
                    const_cast<TensorImpl::SizesType *>(sizes.data()), const_cast<void *>(in.data),
                    const_cast<TensorImpl::DimOrderType *>(info->dim_order().data()));
    Error err = method.set_input(EValue(Tensor(&impl)), i);
    if (err != Error::Ok) fail_et(err, "set_input");
  }
}
#endif

// Output i of input set k goes out as tensor index k * outputs + i (docs/protocol.md).
void send_outputs(const Method &method, size_t set) {
  for (size_t i = 0; i < method.outputs_size(); ++i) {
    const EValue &v = method.get_output(i);
    if (!v.isTensor()) fail(DK_ERR_NOT_TENSOR, "output is not a tensor");
    const Tensor &t = v.toTensor();
    if (!protocol_dtype(t.scalar_type()) || t.dim() > 255)
      fail(DK_ERR_OUTPUT_DTYPE, "output dtype or rank the protocol cannot carry");
    if (dk_send_tensor(static_cast<uint16_t>(set * method.outputs_size() + i),
                       static_cast<uint8_t>(t.scalar_type()), static_cast<uint8_t>(t.dim()),
                       t.sizes().data(), 0.0f, 0, t.const_data_ptr(),
                       static_cast<uint32_t>(t.nbytes())) != 0)
      fail(DK_ERR_SEND, "tensor record refused by the encoder");
  }
}

void send_hello() {
  // On the stack, not static: hello is sent before Method::load, whose frames are deeper, so
  // the stack peak does not grow and 512 B of static RAM are saved.
  char buf[512];
  Text t(buf, sizeof buf);
  const size_t kernels = executorch::runtime::get_registered_kernels().size();
  t << "protocol=1\nboard=" << DK_BOARD_NAME << "\nfirmware=executorch-runner\npte_sha256="
    << DK_PTE_SHA256
#if DK_SERVE
    << "\nserve=1\ninput_protocol=" << DK_STREAM_VERSION  // samples come over the console
#else
    << "\ninputs_sha256=" << DK_INPUTS_SHA256
#endif
    << "\net_commit=" << DK_ET_COMMIT
    << "\nbuild=" << DK_BUILD_INFO << "\net_runtime=" << DK_ET_RUNTIME_KEY
    << "\nkernels=" << static_cast<uint32_t>(kernels) << "/"
    << static_cast<uint32_t>(DK_MAX_KERNEL_NUM) << "\nbackends=";
  const size_t backends = executorch::runtime::get_num_registered_backends();
  for (size_t i = 0; i < backends; ++i) {
    Result<const char *> backend = executorch::runtime::get_backend_name(i);
    if (backend.ok()) t << (i ? "," : "") << *backend;
  }
#if DK_ETHOS_U
  t << "\nnpu=" << DK_NPU_TARGET;
#endif
  dk_send_hello(t.c_str());
}

/* Every backend the program delegates to must be registered in this firmware; otherwise
 * load_method fails with a bare NotFound. Say which one is missing. */
void check_backends(const MethodMeta &meta) {
  for (size_t i = 0; i < meta.num_backends(); ++i) {
    Result<const char *> name = meta.get_backend_name(i);
    if (!name.ok()) fail_et(name.error(), "get_backend_name");
    if (executorch::runtime::get_backend_class(*name) != nullptr) continue;
    char buf[192];
    Text t(buf, sizeof buf);
    t << "the program delegates to " << *name << ", which this firmware does not register ("
      << (executorch::runtime::get_num_registered_backends() ? "it has others" : "it has none")
      << "): build it for the flow that exported the program";
    fail(DK_ERR_NO_BACKEND, t.c_str());
  }
}

#if DK_SERVE
/* ---- serve firmware ---- */
#ifndef DK_SERVE_INPUT_BYTES
#define DK_SERVE_INPUT_BYTES 0
#endif
/* Inputs the program does not plan (read in place from flash by the normal firmware) are
 * received here, each on 16 bytes; planned inputs are received straight into the planned
 * buffer, where the method reads them. deploykit sizes it from the .pte (DK_SERVE_INPUT_BYTES). */
DK_POOL_ATTR uint8_t serve_input_pool[DK_POOL_BYTES(DK_SERVE_INPUT_BYTES)];
constexpr size_t kServeInputs = DK_NUM_INPUTS > 0u ? DK_NUM_INPUTS : 1u;
constexpr size_t kServeOutputs = DK_NUM_OUTPUTS > 0u ? DK_NUM_OUTPUTS : 1u;

/* The serve loop's state is static, not on the stack: execute() runs below the loop's frame,
 * and the stack is fitted to the normal firmware's peak (the margin is not for this). */
dk_stream_input_t serve_inputs[kServeInputs];
dk_stream_t serve_stream;
uint8_t serve_rx[64];

[[noreturn]] void fail_inputs(const char *what, size_t index) {
  char buf[96];
  Text t(buf, sizeof buf);
  t << what << " " << static_cast<uint32_t>(index);
  fail(DK_ERR_SERVE_INPUTS, t.c_str());
}

/* Where each input's bytes go, and the `ready` record: the method's inputs and outputs. Not
 * inlined, so that its frame is gone before the first execute(). */
__attribute__((noinline)) void serve_setup(Method &method, const MethodMeta &meta) {
  const size_t n_in = meta.num_inputs(), n_out = meta.num_outputs();
  if (n_in > DK_NUM_INPUTS) fail_inputs("more inputs than model_config.h: input", n_in - 1u);
  if (n_out > DK_NUM_OUTPUTS) fail_inputs("more outputs than model_config.h: output", n_out - 1u);
  dk_ready_tensor_t ready[kServeInputs + kServeOutputs];
  size_t pool_used = 0;
  for (size_t i = 0; i < n_in; ++i) {
    Result<TensorInfo> info = meta.input_tensor_meta(i);
    if (!info.ok()) fail_inputs("not a tensor: input", i);
    Span<const int32_t> sizes = info->sizes();
    if (sizes.size() > DK_STREAM_MAX_NDIM) fail_inputs("rank over 8: input", i);
    uint8_t *data = nullptr;
    if (info->is_memory_planned()) {
      // The method's own tensor, in the planned buffer. ExecuTorch deprecates reaching it this
      // way in favour of set_input, which would need the sample in a buffer of its own first.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
      data = method.mutable_input(i).toTensor().mutable_data_ptr<uint8_t>();
#pragma GCC diagnostic pop
    } else {
      if (pool_used + info->nbytes() > DK_SERVE_INPUT_BYTES)
        fail_inputs("the serve input pool (DK_SERVE_INPUT_BYTES) is too small for input", i);
      data = serve_input_pool + pool_used;
      pool_used += (info->nbytes() + 15u) & ~size_t(15u);
      // The method reads this input in place, from the pool: set it once.
      TensorImpl impl(info->scalar_type(), static_cast<ssize_t>(sizes.size()),
                      const_cast<TensorImpl::SizesType *>(sizes.data()), data,
                      const_cast<TensorImpl::DimOrderType *>(info->dim_order().data()));
      Error err = method.set_input(EValue(Tensor(&impl)), i);
      if (err != Error::Ok) fail_et(err, "set_input");
    }
    serve_inputs[i] = {static_cast<uint8_t>(info->scalar_type()),
                       static_cast<uint8_t>(sizes.size()), sizes.data(), data,
                       static_cast<uint32_t>(info->nbytes()), 0u};
    ready[i] = {static_cast<uint8_t>(info->scalar_type()), static_cast<uint8_t>(sizes.size()),
                sizes.data(), info->dim_order().data(), static_cast<uint32_t>(info->nbytes())};
  }
  for (size_t i = 0; i < n_out; ++i) {
    Result<TensorInfo> info = meta.output_tensor_meta(i);
    if (!info.ok()) fail(DK_ERR_NOT_TENSOR, "output is not a tensor");
    if (!protocol_dtype(info->scalar_type()) || info->sizes().size() > 255u)
      fail(DK_ERR_OUTPUT_DTYPE, "output dtype or rank the protocol cannot carry");
    ready[n_in + i] = {static_cast<uint8_t>(info->scalar_type()),
                       static_cast<uint8_t>(info->sizes().size()), info->sizes().data(),
                       info->dim_order().data(), static_cast<uint32_t>(info->nbytes())};
  }
  if (dk_send_ready(ready, static_cast<uint16_t>(n_in), static_cast<uint16_t>(n_out)) != 0)
    fail(DK_ERR_SEND, "ready record refused by the encoder");
  dk_stream_init(&serve_stream, serve_inputs, static_cast<uint16_t>(n_in));
}

/* A failed execute() of one sample: its error record, and the code its sample_done carries. */
uint32_t sample_failure(Error err) {
  send_execute_error(err);
  char buf[160];
  Text t(buf, sizeof buf);
  if (temp_allocator.failed_request() != 0) {
    t << "temp_pool too small: " << kTempPoolBytes << " B, a request for "
      << static_cast<uint32_t>(temp_allocator.failed_request()) << " B did not fit";
    dk_send_error(DK_ERR_TEMP_POOL, t.c_str());
    return DK_ERR_TEMP_POOL;
  }
#if DK_ETHOS_U
  if (dk_npu_failure()[0] != '\0') {
    dk_send_error(DK_ERR_NPU_RUN, dk_npu_failure());
    return DK_ERR_NPU_RUN;
  }
#endif
  dk_send_error(static_cast<uint32_t>(err), "execute failed");
  return static_cast<uint32_t>(err);
}

[[noreturn]] void serve(Method &method, const MethodMeta &meta) {
  serve_setup(method, meta);
  uint64_t total_ticks = 0, last_ticks = 0;
  uint32_t runs = 0, last_status = 0;
  size_t have = 0, pos = 0;
  for (;;) {
    if (pos == have) {
      have = dk_console_read(serve_rx, sizeof serve_rx);
      pos = 0;
      if (have == 0) {
        dk_console_wait();  // sleeps where the board can (an mps board with console.rx_irq)
        continue;
      }
    }
    dk_stream_event_t ev;
    pos += dk_stream_feed(&serve_stream, serve_rx + pos, have - pos, &ev);
    if (ev.kind == DK_STREAM_RUN) {
#if defined(DK_WATCHDOG_EXECUTE_MS) && DK_WATCHDOG_EXECUTE_MS > 0
      dk_execute_watch_begin();
#endif
      execute_begins();
      const uint64_t t0 = dk_ticks();
      Error err = method.execute();
      last_ticks = dk_ticks() - t0;
#if defined(DK_WATCHDOG_EXECUTE_MS) && DK_WATCHDOG_EXECUTE_MS > 0
      dk_execute_watch_end();
#endif
      total_ticks += last_ticks;
      runs++;
      last_status = err == Error::Ok ? 0u : sample_failure(err);
      if (last_status == 0u) send_outputs(method, 0);
      dk_send_sample_done(ev.sample, last_status, last_ticks, ev.seq);
      dk_stream_ran(&serve_stream, ev.sample);
    } else if (ev.kind == DK_STREAM_REPLAY) {  // its answer was lost: the same again
      if (last_status == 0u) send_outputs(method, 0);
      dk_send_sample_done(ev.sample, last_status, last_ticks, ev.seq);
    } else if (ev.kind == DK_STREAM_END) {
      dk_send_timing(total_ticks, dk_tick_hz(), runs, DK_INSTRUCTIONS_UNKNOWN);
      send_memory();
      finish(DK_STATUS_OK);
    }
  }
}
#endif

#if DK_RUNNER_HANG
/* The hang variant (-DDK_RUNNER_HANG=ON), which tests that the host locates a hang: it spins
 * here instead of running the method. A function of its own, so that it has a name. */
__attribute__((noinline)) void dk_runner_hang_site() {
  static volatile uint32_t spins;
  for (;;) spins = spins + 1u;
}
#endif

}  // namespace

/* ---- ExecuTorch platform layer (strong definitions over the runtime's weak minimal PAL) ---- */
extern "C" {

void et_pal_init(void) {}

ET_NORETURN void et_pal_abort(void) {
  dk_send_error(DK_ERR_ABORT, "ExecuTorch aborted (et_pal_abort)");
  finish(DK_STATUS_ET_ERROR);
}

et_timestamp_t et_pal_current_ticks(void) { return dk_ticks(); }

et_tick_ratio_t et_pal_ticks_to_ns_multiplier(void) {
  const uint32_t hz = dk_tick_hz();
  // ns per tick = 1e9 / hz; exact for the usual MHz-multiple clocks.
  if (hz != 0u && 1000000000u % hz == 0u) return {1000000000u / hz, 1u};
  return {1000u, hz / 1000000u ? hz / 1000000u : 1u};
}

void et_pal_emit_log_message(et_timestamp_t, et_pal_log_level_t level, const char *, const char *,
                             size_t, const char *message, size_t length) {
  // Only reached when the runtime is built with logging (EXECUTORCH_ENABLE_LOGGING=ON).
  char buf[200];
  const char lv = static_cast<char>(level);
  size_t n = 0;
  buf[n++] = lv;
  buf[n++] = ' ';
  for (size_t i = 0; i < length && message[i] && n < sizeof buf; ++i) buf[n++] = message[i];
  dk_send_log_n(buf, n);
}

void *et_pal_allocate(size_t) { return nullptr; }  // every allocation comes from the pools
void et_pal_free(void *) {}

}  // extern "C"

int main(void) {
  dk_board_init();
  executorch::runtime::runtime_init();
  send_hello();
#if DK_ETHOS_U
  // An NPU that is absent or does not initialise ends the run here, with its error record.
  if (dk_npu_init() != 0) finish(DK_STATUS_ET_ERROR);
#endif
#if DK_PROFILE_EVENTS
  dk_trace_init();
#endif

  BufferDataLoader loader(dk_model_pte, dk_model_pte_size);
  Result<Program> program = Program::load(&loader);
  if (!program.ok()) fail_et(program.error(), "Program::load");

  Result<const char *> name = program->get_method_name(0);
  if (!name.ok()) fail_et(name.error(), "get_method_name");
  Result<MethodMeta> meta = program->method_meta(*name);
  if (!meta.ok()) fail_et(meta.error(), "method_meta");
  check_backends(*meta);

  // Planned memory: one span per planned buffer, each at least as large as the program needs.
  const size_t n_planned = meta->num_memory_planned_buffers();
  if (n_planned != kPlannedCount) {
    char buf[128];
    Text t(buf, sizeof buf);
    t << "model_config.h plans " << static_cast<uint32_t>(kPlannedCount)
      << " buffers, the program has " << static_cast<uint32_t>(n_planned);
    fail(DK_ERR_PLANNED_COUNT, t.c_str());
  }
  static Span<uint8_t> spans[kPlannedCount > 0 ? kPlannedCount : 1];
  size_t offset = 0;
  for (size_t i = 0; i < n_planned; ++i) {
    const int64_t need = meta->memory_planned_buffer_size(i).get();
    if (need > static_cast<int64_t>(kPlannedSizes[i])) {
      char buf[32];
      Text t(buf, sizeof buf);
      t << "planned_pool[" << static_cast<uint32_t>(i) << "]";
      fail_pool(DK_ERR_PLANNED_POOL, t.c_str(), kPlannedSizes[i], static_cast<size_t>(need));
    }
    spans[i] = Span<uint8_t>(planned_pool + offset, kPlannedSizes[i]);
    offset += (kPlannedSizes[i] + 15u) & ~size_t(15u);
    planned_used += static_cast<size_t>(need);
  }
  HierarchicalAllocator planned({spans, n_planned});
  MemoryManager memory(&method_allocator, &planned, &temp_allocator);

#if DK_PROFILE_EVENTS
  Result<Method> method = program->load_method(*name, &memory, dk_trace_tracer());
#else
  Result<Method> method = program->load_method(*name, &memory);
#endif
  if (!method.ok()) {
    if (method_allocator.failed_request() != 0)
      fail_pool(DK_ERR_METHOD_POOL, "method_pool", DK_METHOD_POOL_SIZE, method_allocator.failed_request());
    fail_et(method.error(), "load_method");
  }

#if DK_SERVE
  serve(*method, *meta);
#else
  // Every input set runs through the same loaded method; only execute() is timed.
  uint64_t ticks = 0;
#if DK_PROFILE_EVENTS
  uint64_t tracer_ticks = 0;
  uint32_t tracer_events = 0;
#endif
#if DK_RUNNER_HANG
  dk_runner_hang_site();
#endif
  for (size_t set = 0; set < DK_NUM_INPUT_SETS; ++set) {
    set_inputs(*method, *meta, set);
#if DK_PROFILE_EVENTS
    const uint64_t overhead0 = dk_trace_overhead_ticks();
    const uint32_t events0 = dk_trace_events();
#endif
#if defined(DK_WATCHDOG_EXECUTE_MS) && DK_WATCHDOG_EXECUTE_MS > 0
    dk_execute_watch_begin();
#endif
    execute_begins();
    const uint64_t t0 = dk_ticks();
    Error err = method->execute();
    ticks += dk_ticks() - t0;
#if defined(DK_WATCHDOG_EXECUTE_MS) && DK_WATCHDOG_EXECUTE_MS > 0
    dk_execute_watch_end();
#endif
#if DK_PROFILE_EVENTS
    tracer_ticks += dk_trace_overhead_ticks() - overhead0;
    tracer_events += dk_trace_events() - events0;
#endif
    if (err != Error::Ok) {
      send_execute_error(err);
      if (temp_allocator.failed_request() != 0)
        fail_pool(DK_ERR_TEMP_POOL, "temp_pool", kTempPoolBytes, temp_allocator.failed_request());
#if DK_ETHOS_U
      if (dk_npu_failure()[0] != '\0') fail(DK_ERR_NPU_RUN, dk_npu_failure());
#endif
      fail_et(err, "execute");
    }
    send_outputs(*method, set);
  }
  dk_send_timing(ticks, dk_tick_hz(), DK_NUM_INPUT_SETS, DK_INSTRUCTIONS_UNKNOWN);
#if DK_PROFILE_EVENTS
  dk_trace_send_summary(ticks, tracer_ticks, tracer_events, DK_NUM_INPUT_SETS);
#endif
#if DK_ETHOS_U
  dk_npu_send_records();
#endif
  send_memory();
  finish(DK_STATUS_OK);
#endif
}
