/*
 * event_tracer.cpp: deploykit's ExecuTorch EventTracer (event_tracer.h). Built only into
 * profiling firmware (DK_PROFILE_EVENTS=1); DK_TRACE_INTERMEDIATES=1 also streams every
 * operator's output tensor (deploykit run --debug-intermediates).
 *
 * Each event costs no RAM beyond the EventTracerEntry the runtime keeps on its stack: the entry
 * carries the start time and the event's name (in event_id), and end_profiling() sends the
 * whole event as one `trace_event` record.
 */
#include "event_tracer.h"

#include <string.h>

#include <executorch/runtime/core/evalue.h>

#include "dk_board.h"
#include "dk_protocol.h"

using executorch::aten::Tensor;
using executorch::runtime::AllocatorID;
using executorch::runtime::ArrayRef;
using executorch::runtime::ChainID;
using executorch::runtime::DebugHandle;
using executorch::runtime::DelegateDebugIdType;
using executorch::runtime::DelegateDebugIntId;
using executorch::runtime::EValue;
using executorch::runtime::EventTracer;
using executorch::runtime::EventTracerDebugLogLevel;
using executorch::runtime::EventTracerEntry;
using executorch::runtime::EventTracerFilterBase;
using executorch::runtime::EventTracerProfilingLevel;
using executorch::runtime::kUnsetChainId;
using executorch::runtime::kUnsetDebugHandle;
using executorch::runtime::LoggedEValueType;
using executorch::runtime::Result;

#ifndef DK_TRACE_INTERMEDIATES
#define DK_TRACE_INTERMEDIATES 0
#endif
/* DK_RUNNER_HANG_AT_OP=k (a test variant, CMake option of the same name): spin when the k-th
 * operator (1-based; kernel or delegate call) of an execute() begins, so the host must report
 * the hang with the operator position from the events it has seen. Unset, none of it exists. */
#ifdef DK_RUNNER_HANG_AT_OP
static_assert(DK_RUNNER_HANG_AT_OP >= 1, "DK_RUNNER_HANG_AT_OP counts operators from 1");
#endif

/* ---- the event clock (a board fact: boards/<board>.yaml timer.event_clock) ---- */
#if defined(DK_EVENT_CLOCK_SYSTICK)
#define DK_EVENT_CLOCK_KIND 1u
static void event_clock_init(void) {}
static inline uint64_t event_clock(void) { return dk_ticks(); }
#elif defined(DK_EVENT_CLOCK_DWT_CYCCNT) || defined(DK_EVENT_CLOCK_PMU_CCNT)
#define DEMCR (*(volatile uint32_t *)0xE000EDFCu)
#define DEMCR_TRCENA (1u << 24)
#if defined(DK_EVENT_CLOCK_DWT_CYCCNT)
#define DK_EVENT_CLOCK_KIND 2u
#define DWT_CTRL (*(volatile uint32_t *)0xE0001000u)
#define DWT_CYCCNT (*(volatile uint32_t *)0xE0001004u)
static void event_clock_init(void) {
  DEMCR |= DEMCR_TRCENA;
  DWT_CYCCNT = 0u;
  DWT_CTRL |= 1u; /* CYCCNTENA */
}
static inline uint32_t event_clock32(void) { return DWT_CYCCNT; }
#else
#define DK_EVENT_CLOCK_KIND 3u
/* Armv8.1-M PMU (Cortex-M55/M85): PMU_CTRL.E and .C, PMU_CNTENSET.C. */
#define PMU_CCNTR (*(volatile uint32_t *)0xE000307Cu)
#define PMU_CNTENSET (*(volatile uint32_t *)0xE0003C00u)
#define PMU_CTRL (*(volatile uint32_t *)0xE0003E04u)
static void event_clock_init(void) {
  DEMCR |= DEMCR_TRCENA;
  PMU_CTRL |= (1u << 0) | (1u << 2); /* enable, reset the cycle counter */
  PMU_CNTENSET = 1u << 31;
}
static inline uint32_t event_clock32(void) { return PMU_CCNTR; }
#endif
/* The 32-bit counter extended in software: the tracer reads it at every event, far more often
 * than it wraps (2^32 cycles: 28 s at 150 MHz). */
static uint32_t clock_last;
static uint64_t clock_high;
static inline uint64_t event_clock(void) {
  const uint32_t v = event_clock32();
  if (v < clock_last) clock_high += 1ull << 32;
  clock_last = v;
  return clock_high | v;
}
#else
#error "profiling firmware needs DK_EVENT_CLOCK_SYSTICK, _DWT_CYCCNT or _PMU_CCNT (board file)"
#endif

#ifndef DK_EVENT_CLOCK_HZ
#error "profiling firmware needs DK_EVENT_CLOCK_HZ (board file timer.event_clock)"
#endif

namespace {

constexpr uint32_t kCalibrationPairs = 32u;

#ifdef DK_RUNNER_HANG_AT_OP
__attribute__((noinline)) void dk_trace_hang_site() {
  for (;;) __asm__ volatile("" ::: "memory");
}

/* Counts the operators of the current execute() and hangs at the chosen one. */
void hang_at_operator(const char *name) {
  static uint32_t operators;
  if (strcmp(name, "Method::execute") == 0) {
    operators = 0u;
  } else if (strcmp(name, "OPERATOR_CALL") == 0 || strcmp(name, "DELEGATE_CALL") == 0) {
    if (++operators == static_cast<uint32_t>(DK_RUNNER_HANG_AT_OP)) dk_trace_hang_site();
  }
}
#endif

inline uint8_t *put_u16(uint8_t *p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  return p + 2;
}
inline uint8_t *put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  return p + 4;
}
inline uint8_t *put_u64(uint8_t *p, uint64_t v) {
  p = put_u32(p, static_cast<uint32_t>(v));
  return put_u32(p, static_cast<uint32_t>(v >> 32));
}

class StreamingTracer final : public EventTracer {
 public:
  /* Time with the tracer's own ticks taken out. */
  uint64_t virtual_now() const { return event_clock() - overhead_; }
  uint64_t overhead() const { return overhead_; }
  uint32_t events() const { return events_; }
  void set_sending(bool on) { sending_ = on; }

  void create_event_block(const char *) override {}

  EventTracerEntry start_profiling(const char *name, ChainID chain_id,
                                   DebugHandle debug_handle) override {
#ifdef DK_RUNNER_HANG_AT_OP
    hang_at_operator(name);
#endif
    const uint64_t t = event_clock();
    EventTracerEntry e;
    e.event_id = static_cast<int64_t>(reinterpret_cast<intptr_t>(name));
    e.chain_id = chain_id == kUnsetChainId ? chain_id_ : chain_id;
    e.debug_handle = debug_handle == kUnsetDebugHandle ? debug_handle_ : debug_handle;
    e.start_time = t - overhead_;
    e.delegate_event_id_type = DelegateDebugIdType::kNone;
    overhead_ += event_clock() - t;
    return e;
  }

  EventTracerEntry start_profiling_delegate(const char *name,
                                            DelegateDebugIntId delegate_debug_index) override {
    EventTracerEntry e = start_profiling(name, chain_id_, debug_handle_);
    e.delegate_event_id_type = DelegateDebugIdType::kInt;
    delegate_index_ = delegate_debug_index;
    return e;
  }

  void end_profiling(EventTracerEntry e) override {
    const uint64_t t = event_clock();
    send_event(reinterpret_cast<const char *>(static_cast<intptr_t>(e.event_id)), e.chain_id,
               e.debug_handle, -1, static_cast<uint64_t>(e.start_time), t - overhead_);
    overhead_ += event_clock() - t;
  }

  void end_profiling_delegate(EventTracerEntry e, const void *, size_t) override {
    const uint64_t t = event_clock();
    send_event(reinterpret_cast<const char *>(static_cast<intptr_t>(e.event_id)), e.chain_id,
               e.debug_handle, delegate_index_, static_cast<uint64_t>(e.start_time),
               t - overhead_);
    overhead_ += event_clock() - t;
  }

  /* A backend's own timestamps (et_pal_current_ticks, the board's dk_ticks()): sent as they
   * are, with the tracer's ticks so far taken out. */
  void log_profiling_delegate(const char *name, DelegateDebugIntId delegate_debug_index,
                              et_timestamp_t start_time, et_timestamp_t end_time, const void *,
                              size_t) override {
    const uint64_t t = event_clock();
    send_event(name, chain_id_, debug_handle_, delegate_debug_index,
               static_cast<uint64_t>(start_time) - overhead_,
               static_cast<uint64_t>(end_time) - overhead_);
    overhead_ += event_clock() - t;
  }

  void track_allocation(AllocatorID, size_t) override {}
  AllocatorID track_allocator(const char *) override { return 0; }

  Result<bool> log_evalue(const EValue &evalue, LoggedEValueType evalue_type) override {
#if DK_TRACE_INTERMEDIATES
    const uint64_t t = event_clock();
    if (evalue.isTensor()) {
      send_tensor(evalue.toTensor(), evalue_type == LoggedEValueType::kProgramOutput ? 1u : 0u);
    } else if (evalue.isTensorList()) {
      for (const Tensor &tensor : evalue.toTensorList()) send_tensor(tensor, 0u);
    }
    overhead_ += event_clock() - t;
#else
    (void)evalue;
    (void)evalue_type;
#endif
    return true;
  }

  Result<bool> log_intermediate_output_delegate(const char *, DelegateDebugIntId,
                                                const Tensor &) override {
    return false;
  }
  Result<bool> log_intermediate_output_delegate(const char *, DelegateDebugIntId,
                                                const ArrayRef<Tensor>) override {
    return false;
  }
  Result<bool> log_intermediate_output_delegate(const char *, DelegateDebugIntId,
                                                const int &) override {
    return false;
  }
  Result<bool> log_intermediate_output_delegate(const char *, DelegateDebugIntId,
                                                const bool &) override {
    return false;
  }
  Result<bool> log_intermediate_output_delegate(const char *, DelegateDebugIntId,
                                                const double &) override {
    return false;
  }
  void set_delegation_intermediate_output_filter(EventTracerFilterBase *) override {}

 private:
  /* trace_event: i32 chain, u32 debug_handle, i32 delegate_debug_id, u64 start, u64 end,
   * u8 name_len, name. */
  void send_event(const char *name, ChainID chain, DebugHandle handle, int32_t delegate_id,
                  uint64_t start, uint64_t end) {
    ++events_;
    if (!sending_) return;
    uint8_t b[29];
    uint8_t *p = put_u32(b, static_cast<uint32_t>(chain));
    p = put_u32(p, handle);
    p = put_u32(p, static_cast<uint32_t>(delegate_id));
    p = put_u64(p, start);
    p = put_u64(p, end);
    size_t n = name ? strlen(name) : 0u;
    if (n > 255u) n = 255u;
    *p = static_cast<uint8_t>(n);
    const dk_part_t parts[] = {{b, sizeof b}, {name, n}};
    dk_send_record_parts(DK_REC_TRACE_EVENT, parts, 2u);
  }

#if DK_TRACE_INTERMEDIATES
  /* trace_tensor: i32 chain, u32 debug_handle, u16 ordinal (of the values logged for this
   * instruction), u8 kind (0 intermediate, 1 program output), u8 0, then a `tensor` payload. */
  void send_tensor(const Tensor &t, uint8_t kind) {
    if (debug_handle_ != last_handle_ || chain_id_ != last_chain_) {
      last_handle_ = debug_handle_;
      last_chain_ = chain_id_;
      ordinal_ = 0u;
    }
    const uint16_t ordinal = ordinal_++;
    if (t.dim() > 16) return;
    uint8_t head[12 + 4 + 4 * 16 + 16];
    uint8_t *p = put_u32(head, static_cast<uint32_t>(chain_id_));
    p = put_u32(p, debug_handle_);
    p = put_u16(p, ordinal);
    *p++ = kind;
    *p++ = 0u;
    p = put_u16(p, ordinal);
    *p++ = static_cast<uint8_t>(t.scalar_type());
    *p++ = static_cast<uint8_t>(t.dim());
    for (ssize_t d = 0; d < t.dim(); ++d) p = put_u32(p, static_cast<uint32_t>(t.size(d)));
    p = put_u32(p, 0u); /* scale */
    p = put_u32(p, 0u); /* zero point */
    const uint32_t nbytes = static_cast<uint32_t>(t.nbytes());
    p = put_u32(p, nbytes);
    uint8_t *offset_field = p;
    p += 4;
    const uint8_t *bytes = static_cast<const uint8_t *>(t.const_data_ptr());
    uint32_t offset = 0u;
    do {
      uint32_t n = nbytes - offset;
      if (n > DK_PROTOCOL_CHUNK_BYTES) n = DK_PROTOCOL_CHUNK_BYTES;
      (void)put_u32(offset_field, offset);
      const dk_part_t parts[] = {{head, static_cast<size_t>(p - head)}, {bytes + offset, n}};
      dk_send_record_parts(DK_REC_TRACE_TENSOR, parts, 2u);
      offset += n;
    } while (offset < nbytes);
  }
  DebugHandle last_handle_ = kUnsetDebugHandle;
  ChainID last_chain_ = kUnsetChainId;
  uint16_t ordinal_ = 0u;
#endif

  uint64_t overhead_ = 0u;
  uint32_t events_ = 0u;
  DelegateDebugIntId delegate_index_ = -1;
  bool sending_ = true;
};

StreamingTracer tracer;

}  // namespace

EventTracer *dk_trace_tracer(void) { return &tracer; }
uint64_t dk_trace_overhead_ticks(void) { return tracer.overhead(); }
uint32_t dk_trace_events(void) { return tracer.events(); }

void dk_trace_init(void) {
  event_clock_init();
  tracer.set_event_tracer_profiling_level(EventTracerProfilingLevel::kProfileAllEvents);
#if DK_TRACE_INTERMEDIATES
  tracer.set_event_tracer_debug_level(EventTracerDebugLogLevel::kIntermediateOutputs);
#endif
  // The cost of one event the tracer cannot see of itself: empty start/end pairs through the
  // virtual interface, as the runtime calls them, with sending off.
  EventTracer *volatile through = &tracer;
  tracer.set_sending(false);
  const uint64_t v0 = tracer.virtual_now();
  for (uint32_t i = 0; i < kCalibrationPairs; ++i) {
    EventTracerEntry e = through->start_profiling("calibration");
    through->end_profiling(e);
  }
  const uint64_t v1 = tracer.virtual_now();
  tracer.set_sending(true);
  const uint32_t cost_q8 = static_cast<uint32_t>(((v1 - v0) << 8) / kCalibrationPairs);
  /* trace_clock: u8 kind, u8 debug level, u16 0, u32 hz, u32 event_cost_q8, u32 pairs,
   * u32 tracer bytes. */
  uint8_t b[20];
  uint8_t *p = b;
  *p++ = static_cast<uint8_t>(DK_EVENT_CLOCK_KIND);
  *p++ = DK_TRACE_INTERMEDIATES ? 2u : 0u;
  p = put_u16(p, 0u);
  p = put_u32(p, static_cast<uint32_t>(DK_EVENT_CLOCK_HZ));
  p = put_u32(p, cost_q8);
  p = put_u32(p, kCalibrationPairs);
  (void)put_u32(p, static_cast<uint32_t>(sizeof tracer));
  dk_send_record(DK_REC_TRACE_CLOCK, b, sizeof b);
}

void dk_trace_send_summary(uint64_t execute_ticks, uint64_t tracer_ticks, uint32_t events,
                           uint32_t iterations) {
  /* trace_summary: u64 execute ticks (dk_ticks, raw), u64 tracer ticks (event clock), u32 events,
   * u32 iterations. */
  uint8_t b[24];
  uint8_t *p = put_u64(b, execute_ticks);
  p = put_u64(p, tracer_ticks);
  p = put_u32(p, events);
  (void)put_u32(p, iterations);
  dk_send_record(DK_REC_TRACE_SUMMARY, b, sizeof b);
}
