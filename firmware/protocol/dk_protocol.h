/*
 * dk_protocol.h: encoder for the deploykit result protocol, version 1 (docs/protocol.md).
 *
 * Every record is written straight to the console through dk_console_write() (dk_board.h) as
 * one frame: magic A5 44 4B, version, type, flags, seq, length, payload, CRC-32 (zlib.crc32 of
 * version..payload). Nothing is buffered and nothing uses printf or the heap. The encoder is not
 * reentrant: send records from one context at a time (the fault handler is the exception; it
 * may interrupt a half-sent frame, which the host then counts as corrupted and skips).
 *
 * Usable from C11 and C++17.
 */
#ifndef DK_PROTOCOL_H
#define DK_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DK_PROTOCOL_VERSION 1u

/* Record types. */
enum {
  DK_REC_HELLO = 1,
  DK_REC_TENSOR = 2,
  DK_REC_TIMING = 3,
  DK_REC_MEMORY = 4,
  DK_REC_ERROR = 5,
  DK_REC_FAULT = 6,
  DK_REC_DONE = 7,
  DK_REC_LOG = 8,
  DK_REC_NPU = 9,
  /* Profiling firmware only (DK_PROFILE_EVENTS, firmware/runner/event_tracer.cpp). */
  DK_REC_TRACE_CLOCK = 10,
  DK_REC_TRACE_EVENT = 11,
  DK_REC_TRACE_TENSOR = 12,
  DK_REC_TRACE_SUMMARY = 13,
  /* Serve firmware only (DK_SERVE, docs/protocol.md "Host -> device"). */
  DK_REC_SAMPLE_DONE = 14,
  DK_REC_READY = 15,
  /* Every runner firmware: where a failed execute() stopped, before its `error` record. */
  DK_REC_EXECUTE_ERROR = 16
};

/* `done` status values, also the program's exit code. */
enum {
  DK_STATUS_OK = 0,
  DK_STATUS_ET_ERROR = 1,
  DK_STATUS_FAULT = 2,
  DK_STATUS_POOL_TOO_SMALL = 3
};

/* ExecuTorch ScalarType codes used in `tensor` records. */
enum {
  DK_DTYPE_UINT8 = 0,
  DK_DTYPE_INT8 = 1,
  DK_DTYPE_INT16 = 2,
  DK_DTYPE_INT32 = 3,
  DK_DTYPE_INT64 = 4,
  DK_DTYPE_FLOAT32 = 6,
  DK_DTYPE_FLOAT64 = 7,
  DK_DTYPE_BOOL = 11
};

/* Largest payload a frame may carry (protocol limit). */
#define DK_PROTOCOL_MAX_PAYLOAD 65536u

/* Tensor data bytes per `tensor` record; larger tensors go out as several chunks. A
 * compile-time constant; override with -DDK_PROTOCOL_CHUNK_BYTES=n (1..60000). */
#ifndef DK_PROTOCOL_CHUNK_BYTES
#define DK_PROTOCOL_CHUNK_BYTES 1024
#endif

/* `timing.instructions` when the firmware cannot count instructions. */
#define DK_INSTRUCTIONS_UNKNOWN UINT64_MAX

/* One entry of a `memory` record. `name` is ASCII, at most 255 bytes
 * (method_pool, planned_pool, temp_pool, stack, heap, ...). */
typedef struct dk_memory_entry {
  const char *name;
  uint32_t used;     /* high-water mark, bytes */
  uint32_t capacity; /* size linked into the firmware, bytes */
} dk_memory_entry_t;

/* One named counter of an `npu` record. `name` is ASCII, at most 255 bytes
 * (axi0_rd_beats, idle_cycles, ...). */
typedef struct dk_counter {
  const char *name;
  uint64_t value;
} dk_counter_t;

/* Register state of a fault, in record order. */
typedef struct dk_fault_regs {
  uint32_t r0, r1, r2, r3, r12, lr, pc, xpsr;
  uint32_t cfsr, hfsr, mmfar, bfar, exc_return;
} dk_fault_regs_t;

/* CRC-32 (IEEE 802.3, reflected, poly 0xEDB88320), continuable like zlib.crc32:
 * dk_crc32(dk_crc32(0, a, n), b, m) == zlib.crc32(b, zlib.crc32(a)). */
uint32_t dk_crc32(uint32_t crc, const void *data, size_t len);

/* One frame with an arbitrary payload. Returns 0, or -1 if len > DK_PROTOCOL_MAX_PAYLOAD. */
int dk_send_record(uint8_t type, const void *payload, size_t len);

/* `hello`: `text` holds key=value lines separated by '\n' (protocol=1, board, firmware, ...). */
void dk_send_hello(const char *text);

/* `tensor`: the whole tensor, in chunks of DK_PROTOCOL_CHUNK_BYTES data bytes (an empty tensor
 * still sends one chunk). `sizes` has `ndim` entries (ExecuTorch sizes are int32). `scale` and
 * `zero_point` are 0 for non-quantized outputs. Returns 0, or -1 on bad arguments. */
int dk_send_tensor(uint16_t index, uint8_t dtype, uint8_t ndim, const int32_t *sizes,
                   float scale, int32_t zero_point, const void *data, uint32_t nbytes);

/* `timing`: `ticks` at `tick_hz` over `iterations` runs; `instructions` or
 * DK_INSTRUCTIONS_UNKNOWN. */
void dk_send_timing(uint64_t ticks, uint32_t tick_hz, uint32_t iterations,
                    uint64_t instructions);

/* `memory`: `count` entries. Returns 0, or -1 if a name is longer than 255 bytes or the record
 * would exceed the payload limit. */
int dk_send_memory(const dk_memory_entry_t *entries, size_t count);

/* `npu`: one NPU command stream run (one delegate call): its index in this run, the NPU's
 * cycle counter, the CPU ticks (dk_ticks) the whole delegate call took, and `count` named
 * counters of the NPU's PMU. Returns 0, or -1 if a name is longer than 255 bytes or the
 * record would exceed the payload limit. */
int dk_send_npu(uint32_t call, uint64_t npu_cycles, uint64_t cpu_ticks,
                const dk_counter_t *counters, size_t count);

/* `error`: an ExecuTorch Error value or a deploykit code, and a message. */
void dk_send_error(uint32_t code, const char *message);

/* `execute_error`: where a failed execute() stopped: its Error `code`, the `step` (the
 * instructions it ran before the one that failed, counted from 0; DK_EXECUTE_STEP_NONE when it
 * failed before its first instruction) and, when a kernel's library call refused, that call's
 * status and the function's name (`kernel_call` NULL and status 0 otherwise). */
#define DK_EXECUTE_STEP_NONE UINT32_MAX
void dk_send_execute_error(uint32_t code, uint32_t step, int32_t kernel_status,
                           const char *kernel_call);

/* `fault`: the 13 registers. */
void dk_send_fault(const dk_fault_regs_t *regs);

/* `done`: the final record; `records` is filled in (records sent before this one). */
void dk_send_done(uint32_t status);

/* `log`: free UTF-8 text. dk_send_log_n takes a length instead of a terminator. */
void dk_send_log(const char *text);
void dk_send_log_n(const char *text, size_t len);

#if DK_PROFILE_EVENTS
/* One piece of a record's payload, for dk_send_record_parts. */
typedef struct dk_part {
  const void *data;
  size_t len;
} dk_part_t;

/* One frame whose payload is the concatenation of `count` parts (no copy). Returns 0, or -1 if
 * the total exceeds DK_PROTOCOL_MAX_PAYLOAD. Compiled only into profiling firmware, so that a
 * build without it stays byte-identical. */
int dk_send_record_parts(uint8_t type, const dk_part_t *parts, size_t count);
#endif

#if DK_SERVE
/* One tensor of a `ready` record: an input or output of the loaded method as the serve
 * firmware takes or sends it (`sizes` and `dim_order` have `ndim` entries). */
typedef struct dk_ready_tensor {
  uint8_t dtype;
  uint8_t ndim;
  const int32_t *sizes;
  const uint8_t *dim_order;
  uint32_t nbytes;
} dk_ready_tensor_t;

/* `ready`: the method is loaded and the firmware serves; `tensors` holds its `inputs` inputs
 * and then its `outputs` outputs. Returns 0, or -1 if the record would exceed the payload
 * limit. Compiled only into serve firmware (DK_SERVE), so that other builds stay
 * byte-identical. */
int dk_send_ready(const dk_ready_tensor_t *tensors, uint16_t inputs, uint16_t outputs);

/* `sample_done`: the answer to a host `run` frame (seq `run_seq`): the sample, its status (0,
 * or the code of the error record sent before it) and the ticks its execute() took. */
void dk_send_sample_done(uint32_t sample, uint32_t status, uint64_t ticks, uint16_t run_seq);
#endif

/* Records sent since boot (not wrapped, unlike seq). */
uint32_t dk_protocol_records_sent(void);

#ifdef __cplusplus
}
#endif

#endif /* DK_PROTOCOL_H */
