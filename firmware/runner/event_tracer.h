/*
 * event_tracer.h: deploykit's ExecuTorch EventTracer for profiling firmware (DK_PROFILE_EVENTS).
 *
 * Instead of ETDumpGen's flatbuffer in RAM (which needs more than 128 KiB), every event goes out
 * as a record of the result protocol the moment it ends (docs/protocol.md, types 10-13); the host
 * rebuilds the ETDump from the records (tools/deploykit/profiling/etdump.py).
 *
 * Time: the board's event clock (boards/<board>.yaml `timer.event_clock`, passed as DK_EVENT_CLOCK_*):
 * SysTick through dk_ticks() (its 24-bit wrap counted by the SysTick interrupt), DWT CYCCNT or
 * the Armv8.1-M PMU cycle counter (32 bits, extended to 64 in software). Every timestamp the
 * tracer reports is on a clock that stops while the tracer itself runs: the ticks spent inside
 * the tracer (sending records included) are counted and subtracted. What the tracer cannot see
 * of itself (the calls into it, before its first and after its last clock read) is measured
 * once at start-up, `event_cost_q8` of the clock record, for the host to subtract per event.
 */
#ifndef DK_EVENT_TRACER_H
#define DK_EVENT_TRACER_H

#include <stddef.h>
#include <stdint.h>

#include <executorch/runtime/core/event_tracer.h>

/* Calibrates the tracer and sends the `trace_clock` record. Call once after hello. */
void dk_trace_init(void);

/* The tracer to pass to Program::load_method. */
executorch::runtime::EventTracer *dk_trace_tracer(void);

/* Ticks the tracer spent in itself so far, and the events it has ended so far: the runner reads
 * them around execute() for the `trace_summary` record. */
uint64_t dk_trace_overhead_ticks(void);
uint32_t dk_trace_events(void);

/* `trace_summary`: the raw ticks of every execute() (as measured by the runner's dk_ticks()),
 * the tracer's own ticks and its events inside them, and the number of execute() calls. */
void dk_trace_send_summary(uint64_t execute_ticks, uint64_t tracer_ticks, uint32_t events,
                           uint32_t iterations);

#endif /* DK_EVENT_TRACER_H */
