/* dk_protocol.c: encoder for the deploykit result protocol, version 1 (docs/protocol.md). */
#include "dk_protocol.h"

#include <string.h>

#include "dk_board.h"

#if DK_PROTOCOL_CHUNK_BYTES < 1 || DK_PROTOCOL_CHUNK_BYTES > 60000
#error "DK_PROTOCOL_CHUNK_BYTES must be 1..60000 (a chunk plus its header fits one frame)"
#endif

#define DK_HEADER_BYTES 12u

static uint16_t dk_seq;      /* seq of the next record */
static uint32_t dk_records;  /* records sent since boot */
static uint32_t dk_frame_crc;

/* ---- CRC-32, reflected 0xEDB88320, nibble table (64 bytes) ---- */

static const uint32_t dk_crc_nibble[16] = {
    0x00000000u, 0x1DB71064u, 0x3B6E20C8u, 0x26D930ACu, 0x76DC4190u, 0x6B6B51F4u,
    0x4DB26158u, 0x5005713Cu, 0xEDB88320u, 0xF00F9344u, 0xD6D6A3E8u, 0xCB61B38Cu,
    0x9B64C2B0u, 0x86D3D2D4u, 0xA00AE278u, 0xBDBDF21Cu,
};

uint32_t dk_crc32(uint32_t crc, const void *data, size_t len) {
  const uint8_t *p = (const uint8_t *)data;
  crc = ~crc;
  while (len--) {
    crc ^= *p++;
    crc = (crc >> 4) ^ dk_crc_nibble[crc & 0xFu];
    crc = (crc >> 4) ^ dk_crc_nibble[crc & 0xFu];
  }
  return ~crc;
}

/* ---- little-endian helpers ---- */

static uint8_t *dk_put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  return p + 2;
}

static uint8_t *dk_put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
  return p + 4;
}

static uint8_t *dk_put_u64(uint8_t *p, uint64_t v) {
  p = dk_put_u32(p, (uint32_t)v);
  return dk_put_u32(p, (uint32_t)(v >> 32));
}

/* ---- streaming frame writer: begin, put payload pieces, end ---- */

static void dk_frame_begin(uint8_t type, uint32_t len) {
  uint8_t h[DK_HEADER_BYTES];
  uint8_t *p = h;
  *p++ = 0xA5u;
  *p++ = (uint8_t)'D';
  *p++ = (uint8_t)'K';
  *p++ = (uint8_t)DK_PROTOCOL_VERSION;
  *p++ = type;
  *p++ = 0u; /* flags */
  p = dk_put_u16(p, dk_seq);
  (void)dk_put_u32(p, len);
  dk_console_write(h, sizeof h);
  dk_frame_crc = dk_crc32(0u, h + 3, sizeof h - 3u);
}

static void dk_frame_put(const void *data, size_t len) {
  if (len == 0u) return;
  dk_console_write(data, len);
  dk_frame_crc = dk_crc32(dk_frame_crc, data, len);
}

static void dk_frame_end(void) {
  uint8_t c[4];
  (void)dk_put_u32(c, dk_frame_crc);
  dk_console_write(c, sizeof c);
  dk_seq = (uint16_t)(dk_seq + 1u);
  dk_records++;
}

/* ---- records ---- */

int dk_send_record(uint8_t type, const void *payload, size_t len) {
  if (len > DK_PROTOCOL_MAX_PAYLOAD) return -1;
  dk_frame_begin(type, (uint32_t)len);
  dk_frame_put(payload, len);
  dk_frame_end();
  return 0;
}

static void dk_send_text(uint8_t type, const char *prefix, size_t prefix_len, const char *text,
                         size_t len) {
  if (len > DK_PROTOCOL_MAX_PAYLOAD - prefix_len) len = DK_PROTOCOL_MAX_PAYLOAD - prefix_len;
  dk_frame_begin(type, (uint32_t)(prefix_len + len));
  dk_frame_put(prefix, prefix_len);
  dk_frame_put(text, len);
  dk_frame_end();
}

void dk_send_hello(const char *text) {
  dk_send_text(DK_REC_HELLO, NULL, 0u, text, text ? strlen(text) : 0u);
}

void dk_send_log(const char *text) {
  dk_send_text(DK_REC_LOG, NULL, 0u, text, text ? strlen(text) : 0u);
}

void dk_send_log_n(const char *text, size_t len) {
  dk_send_text(DK_REC_LOG, NULL, 0u, text, text ? len : 0u);
}

void dk_send_error(uint32_t code, const char *message) {
  uint8_t c[4];
  (void)dk_put_u32(c, code);
  dk_send_text(DK_REC_ERROR, (const char *)c, sizeof c, message,
               message ? strlen(message) : 0u);
}

void dk_send_execute_error(uint32_t code, uint32_t step, int32_t kernel_status,
                           const char *kernel_call) {
  uint8_t fixed[12];
  uint8_t *p = dk_put_u32(fixed, code);
  p = dk_put_u32(p, step);
  (void)dk_put_u32(p, (uint32_t)kernel_status);
  dk_send_text(DK_REC_EXECUTE_ERROR, (const char *)fixed, sizeof fixed, kernel_call,
               kernel_call ? strlen(kernel_call) : 0u);
}

int dk_send_tensor(uint16_t index, uint8_t dtype, uint8_t ndim, const int32_t *sizes,
                   float scale, int32_t zero_point, const void *data, uint32_t nbytes) {
  if ((ndim != 0u && sizes == NULL) || (nbytes != 0u && data == NULL)) return -1;
  uint8_t fixed[4];
  uint8_t tail[16];
  uint32_t scale_bits;
  memcpy(&scale_bits, &scale, sizeof scale_bits);
  fixed[0] = (uint8_t)index;
  fixed[1] = (uint8_t)(index >> 8);
  fixed[2] = dtype;
  fixed[3] = ndim;
  const uint32_t header_len = (uint32_t)sizeof fixed + 4u * ndim + (uint32_t)sizeof tail;
  const uint8_t *bytes = (const uint8_t *)data;
  uint32_t offset = 0u;
  do {
    uint32_t n = nbytes - offset;
    if (n > DK_PROTOCOL_CHUNK_BYTES) n = DK_PROTOCOL_CHUNK_BYTES;
    dk_frame_begin(DK_REC_TENSOR, header_len + n);
    dk_frame_put(fixed, sizeof fixed);
    for (uint8_t i = 0u; i < ndim; ++i) {
      uint8_t s[4];
      (void)dk_put_u32(s, (uint32_t)sizes[i]);
      dk_frame_put(s, sizeof s);
    }
    uint8_t *p = dk_put_u32(tail, scale_bits);
    p = dk_put_u32(p, (uint32_t)zero_point);
    p = dk_put_u32(p, nbytes);
    (void)dk_put_u32(p, offset);
    dk_frame_put(tail, sizeof tail);
    if (n != 0u) dk_frame_put(bytes + offset, n);
    dk_frame_end();
    offset += n;
  } while (offset < nbytes);
  return 0;
}

void dk_send_timing(uint64_t ticks, uint32_t tick_hz, uint32_t iterations,
                    uint64_t instructions) {
  uint8_t b[24];
  uint8_t *p = dk_put_u64(b, ticks);
  p = dk_put_u32(p, tick_hz);
  p = dk_put_u32(p, iterations);
  (void)dk_put_u64(p, instructions);
  (void)dk_send_record(DK_REC_TIMING, b, sizeof b);
}

int dk_send_memory(const dk_memory_entry_t *entries, size_t count) {
  size_t total = 0u;
  for (size_t i = 0u; i < count; ++i) {
    size_t n = entries[i].name ? strlen(entries[i].name) : 0u;
    if (n > 255u) return -1;
    total += 1u + n + 8u;
  }
  if (total > DK_PROTOCOL_MAX_PAYLOAD) return -1;
  dk_frame_begin(DK_REC_MEMORY, (uint32_t)total);
  for (size_t i = 0u; i < count; ++i) {
    uint8_t b[8];
    uint8_t n = (uint8_t)(entries[i].name ? strlen(entries[i].name) : 0u);
    dk_frame_put(&n, 1u);
    dk_frame_put(entries[i].name, n);
    uint8_t *p = dk_put_u32(b, entries[i].used);
    (void)dk_put_u32(p, entries[i].capacity);
    dk_frame_put(b, sizeof b);
  }
  dk_frame_end();
  return 0;
}

int dk_send_npu(uint32_t call, uint64_t npu_cycles, uint64_t cpu_ticks,
                const dk_counter_t *counters, size_t count) {
  size_t total = 4u + 8u + 8u + 1u;
  if (count > 255u) return -1;
  for (size_t i = 0u; i < count; ++i) {
    size_t n = counters[i].name ? strlen(counters[i].name) : 0u;
    if (n > 255u) return -1;
    total += 1u + n + 8u;
  }
  if (total > DK_PROTOCOL_MAX_PAYLOAD) return -1;
  uint8_t b[21];
  uint8_t *p = dk_put_u32(b, call);
  p = dk_put_u64(p, npu_cycles);
  p = dk_put_u64(p, cpu_ticks);
  *p = (uint8_t)count;
  dk_frame_begin(DK_REC_NPU, (uint32_t)total);
  dk_frame_put(b, sizeof b);
  for (size_t i = 0u; i < count; ++i) {
    uint8_t v[8];
    uint8_t n = (uint8_t)(counters[i].name ? strlen(counters[i].name) : 0u);
    dk_frame_put(&n, 1u);
    dk_frame_put(counters[i].name, n);
    (void)dk_put_u64(v, counters[i].value);
    dk_frame_put(v, sizeof v);
  }
  dk_frame_end();
  return 0;
}

void dk_send_fault(const dk_fault_regs_t *regs) {
  const uint32_t v[13] = {regs->r0,   regs->r1,   regs->r2,    regs->r3,  regs->r12,
                          regs->lr,   regs->pc,   regs->xpsr,  regs->cfsr, regs->hfsr,
                          regs->mmfar, regs->bfar, regs->exc_return};
  uint8_t b[sizeof v];
  for (size_t i = 0u; i < 13u; ++i) (void)dk_put_u32(b + 4u * i, v[i]);
  (void)dk_send_record(DK_REC_FAULT, b, sizeof b);
}

void dk_send_done(uint32_t status) {
  uint8_t b[8];
  uint8_t *p = dk_put_u32(b, status);
  (void)dk_put_u32(p, dk_records);
  (void)dk_send_record(DK_REC_DONE, b, sizeof b);
}

#if DK_PROFILE_EVENTS
int dk_send_record_parts(uint8_t type, const dk_part_t *parts, size_t count) {
  size_t total = 0u;
  for (size_t i = 0u; i < count; ++i) total += parts[i].len;
  if (total > DK_PROTOCOL_MAX_PAYLOAD) return -1;
  dk_frame_begin(type, (uint32_t)total);
  for (size_t i = 0u; i < count; ++i) dk_frame_put(parts[i].data, parts[i].len);
  dk_frame_end();
  return 0;
}
#endif

#if DK_SERVE
int dk_send_ready(const dk_ready_tensor_t *tensors, uint16_t inputs, uint16_t outputs) {
  size_t total = 4u;
  const size_t count = (size_t)inputs + outputs;
  for (size_t i = 0u; i < count; ++i) total += 6u + 5u * tensors[i].ndim;
  if (total > DK_PROTOCOL_MAX_PAYLOAD) return -1;
  uint8_t b[6];
  uint8_t *p = dk_put_u16(b, inputs);
  (void)dk_put_u16(p, outputs);
  dk_frame_begin(DK_REC_READY, (uint32_t)total);
  dk_frame_put(b, 4u);
  for (size_t i = 0u; i < count; ++i) {
    const dk_ready_tensor_t *t = &tensors[i];
    b[0] = t->dtype;
    b[1] = t->ndim;
    (void)dk_put_u32(b + 2, t->nbytes);
    dk_frame_put(b, 6u);
    for (uint8_t d = 0u; d < t->ndim; ++d) {
      uint8_t v[4];
      (void)dk_put_u32(v, (uint32_t)t->sizes[d]);
      dk_frame_put(v, sizeof v);
    }
    dk_frame_put(t->dim_order, t->ndim);
  }
  dk_frame_end();
  return 0;
}

void dk_send_sample_done(uint32_t sample, uint32_t status, uint64_t ticks, uint16_t run_seq) {
  uint8_t b[20];
  uint8_t *p = dk_put_u32(b, sample);
  p = dk_put_u32(p, status);
  p = dk_put_u64(p, ticks);
  p = dk_put_u16(p, run_seq);
  (void)dk_put_u16(p, 0u);
  (void)dk_send_record(DK_REC_SAMPLE_DONE, b, sizeof b);
}
#endif

uint32_t dk_protocol_records_sent(void) { return dk_records; }
