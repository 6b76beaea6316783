/* dk_stream.c: the device side of the host -> device frames (dk_stream.h, docs/protocol.md). */
#include "dk_stream.h"

#include <string.h>

#include "dk_errors.h"
#include "dk_protocol.h"

enum { ST_HUNT, ST_HEAD, ST_FIXED, ST_DATA, ST_CRC };

#define HEAD_BYTES 9u /* version, type, flags, seq (2), length (4) */

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* ---- error messages: a bounded text buffer, no printf ---- */

typedef struct text {
  char buf[160];
  size_t len;
} text_t;

static void put_str(text_t *t, const char *s) {
  while (*s && t->len + 1u < sizeof t->buf) t->buf[t->len++] = *s++;
  t->buf[t->len] = '\0';
}

static void put_u32(text_t *t, uint32_t v) {
  char d[10];
  size_t n = 0u;
  do {
    d[n++] = (char)('0' + v % 10u);
    v /= 10u;
  } while (v);
  while (n && t->len + 1u < sizeof t->buf) t->buf[t->len++] = d[--n];
  t->buf[t->len] = '\0';
}

static void put_hex8(text_t *t, uint8_t v) {
  static const char digits[] = "0123456789abcdef";
  const char s[5] = {'0', 'x', digits[v >> 4], digits[v & 15u], '\0'};
  put_str(t, s);
}

/* "dtype 6 [1, 3, 8, 8]" */
static void put_shape(text_t *t, uint8_t dtype, uint8_t ndim, const uint8_t *le_sizes,
                      const int32_t *sizes) {
  put_str(t, "dtype ");
  put_u32(t, dtype);
  put_str(t, " [");
  for (uint8_t d = 0u; d < ndim; ++d) {
    if (d) put_str(t, ", ");
    put_u32(t, le_sizes ? get_u32(le_sizes + 4u * d) : (uint32_t)sizes[d]);
  }
  put_str(t, "]");
}

static void put_frame(text_t *t, const dk_stream_t *s) {
  put_str(t, "host frame type ");
  put_hex8(t, s->type);
  put_str(t, " seq ");
  put_u32(t, s->seq);
}

/* ---- the input frame's header ---- */

static uint32_t frame_sample(const dk_stream_t *s) { return get_u32(s->fixed); }
static uint16_t frame_index(const dk_stream_t *s) { return get_u16(s->fixed + 4); }
static uint8_t frame_dtype(const dk_stream_t *s) { return s->fixed[6]; }
static uint8_t frame_ndim(const dk_stream_t *s) { return s->fixed[7]; }
static uint32_t frame_offset(const dk_stream_t *s) {
  return get_u32(s->fixed + 8u + 4u * frame_ndim(s));
}

/* Where a chunk of input `index` of `sample` may start: at 0 always, or at the next byte of
 * the sample the inputs hold. */
static uint32_t next_byte(const dk_stream_t *s, uint32_t sample, uint16_t index) {
  return sample == s->sample ? s->inputs[index].received : 0u;
}

/* The code a complete input header is rejected with (0: it may be written). */
static uint32_t check_input(const dk_stream_t *s) {
  const uint16_t index = frame_index(s);
  if (index >= s->count) return DK_ERR_STREAM_SHAPE;
  const dk_stream_input_t *in = &s->inputs[index];
  if (frame_dtype(s) != in->dtype || frame_ndim(s) != in->ndim) return DK_ERR_STREAM_SHAPE;
  for (uint8_t d = 0u; d < in->ndim; ++d)
    if (get_u32(s->fixed + 8u + 4u * d) != (uint32_t)in->sizes[d]) return DK_ERR_STREAM_SHAPE;
  const uint32_t offset = frame_offset(s);
  if (offset != 0u && offset != next_byte(s, frame_sample(s), index)) return DK_ERR_STREAM_OFFSET;
  const uint32_t n = s->length - s->fixed_len;
  if (offset > in->nbytes || n > in->nbytes - offset) return DK_ERR_STREAM_OVERRUN;
  return 0u;
}

/* The error record of a rejected frame (its CRC matched: the frame itself is wrong). */
static void send_reject(dk_stream_t *s) {
  text_t t = {{0}, 0u};
  put_frame(&t, s);
  const uint32_t code = s->reject;
  if (code == DK_ERR_STREAM_TYPE) {
    put_str(&t, ": unknown type (input 0x40, run 0x41, end 0x42)");
  } else if (code == DK_ERR_STREAM_LENGTH) {
    put_str(&t, ": length ");
    put_u32(&t, s->length);
    if (s->type == DK_HOST_RUN) {
      put_str(&t, ", a run carries 4 bytes");
    } else if (s->type == DK_HOST_END) {
      put_str(&t, ", an end carries none");
    } else {
      put_str(&t, " is shorter than the input header (");
      put_u32(&t, s->fixed_len > 8u ? s->fixed_len : 8u); /* 8 before the rank is known */
      put_str(&t, " bytes)");
    }
  } else {
    const uint16_t index = frame_index(s);
    put_str(&t, ": input ");
    put_u32(&t, index);
    if (code == DK_ERR_STREAM_SHAPE && index >= s->count) {
      put_str(&t, ", the method has ");
      put_u32(&t, s->count);
    } else if (code == DK_ERR_STREAM_SHAPE) {
      const dk_stream_input_t *in = &s->inputs[index];
      put_str(&t, " is ");
      if (frame_ndim(s) > DK_STREAM_MAX_NDIM) {
        put_str(&t, "of rank ");
        put_u32(&t, frame_ndim(s));
      } else {
        put_shape(&t, frame_dtype(s), frame_ndim(s), s->fixed + 8, NULL);
      }
      put_str(&t, ", the method takes ");
      put_shape(&t, in->dtype, in->ndim, NULL, in->sizes);
    } else {
      put_str(&t, " of sample ");
      put_u32(&t, frame_sample(s));
      put_str(&t, ": bytes ");
      put_u32(&t, frame_offset(s));
      put_str(&t, "+");
      put_u32(&t, s->length - s->fixed_len);
      if (code == DK_ERR_STREAM_OFFSET) {
        put_str(&t, " do not start at 0 or at its next byte, ");
        put_u32(&t, next_byte(s, frame_sample(s), index));
      } else {
        put_str(&t, " run past its ");
        put_u32(&t, s->inputs[index].nbytes);
      }
    }
  }
  dk_send_error(code, t.buf);
  s->rejected++;
}

/* ---- frame level ---- */

static void hunt(dk_stream_t *s) {
  s->state = ST_HUNT;
  s->got = 0u;
  s->writing = 0u;
}

/* The header is complete: check the length against the type, set up the payload. */
static void begin_payload(dk_stream_t *s) {
  s->type = s->head[1];
  s->seq = get_u16(s->head + 3);
  s->length = get_u32(s->head + 5);
  s->reject = 0u;
  s->body = 0u;
  s->got = 0u;
  s->fixed_len = 0u;
  if (s->length > DK_PROTOCOL_MAX_PAYLOAD) {
    /* The length cannot be trusted to skip the frame: report it and hunt from here. */
    text_t t = {{0}, 0u};
    put_frame(&t, s);
    put_str(&t, ": length ");
    put_u32(&t, s->length);
    put_str(&t, " is over the protocol's 65536");
    dk_send_error(DK_ERR_STREAM_LENGTH, t.buf);
    s->rejected++;
    hunt(s);
    return;
  }
  s->crc = dk_crc32(0u, s->head, HEAD_BYTES);
  if (s->type == DK_HOST_INPUT) {
    s->fixed_len = 8u; /* grows by the sizes and the offset once ndim is known */
    if (s->length < s->fixed_len) s->reject = DK_ERR_STREAM_LENGTH;
  } else if (s->type == DK_HOST_RUN) {
    s->fixed_len = 4u;
    if (s->length != 4u) s->reject = DK_ERR_STREAM_LENGTH;
  } else if (s->type == DK_HOST_END) {
    if (s->length != 0u) s->reject = DK_ERR_STREAM_LENGTH;
  } else {
    s->reject = DK_ERR_STREAM_TYPE;
  }
  if (s->reject) s->fixed_len = 0u; /* consume the payload unread */
  s->state = s->fixed_len ? ST_FIXED : (s->length ? ST_DATA : ST_CRC);
}

/* The fixed part is complete: an input frame's header is checked before any byte is written. */
static void end_fixed(dk_stream_t *s) {
  if (s->type == DK_HOST_INPUT) {
    s->reject = check_input(s);
    if (!s->reject && s->length > s->fixed_len) {
      s->writing = 1u;
      s->index = frame_index(s);
      s->offset = frame_offset(s);
      s->done_valid = 0u; /* the inputs' memory may hold the last sample's outputs */
    }
  }
  s->state = s->body < s->length ? ST_DATA : ST_CRC;
  s->got = 0u;
}

static int complete(const dk_stream_t *s, uint32_t sample, uint16_t *short_input) {
  for (uint16_t i = 0u; i < s->count; ++i) {
    if (s->inputs[i].received != s->inputs[i].nbytes ||
        (sample != s->sample && s->inputs[i].nbytes != 0u)) {
      *short_input = i;
      return 0;
    }
  }
  return 1;
}

static void run_frame(dk_stream_t *s, dk_stream_event_t *ev) {
  const uint32_t sample = get_u32(s->fixed);
  uint16_t short_input = 0u;
  if (s->done_valid && sample == s->done_sample) {
    ev->kind = DK_STREAM_REPLAY;
  } else if (complete(s, sample, &short_input)) {
    ev->kind = DK_STREAM_RUN;
  } else {
    text_t t = {{0}, 0u};
    put_str(&t, "run of sample ");
    put_u32(&t, sample);
    put_str(&t, " (seq ");
    put_u32(&t, s->seq);
    put_str(&t, "): input ");
    put_u32(&t, short_input);
    if (s->sample == UINT32_MAX) {
      put_str(&t, " has no bytes yet");
    } else if (sample != s->sample) {
      put_str(&t, " holds bytes of sample ");
      put_u32(&t, s->sample);
    } else {
      put_str(&t, " has ");
      put_u32(&t, s->inputs[short_input].received);
      put_str(&t, " of ");
      put_u32(&t, s->inputs[short_input].nbytes);
      put_str(&t, " bytes");
    }
    dk_send_error(DK_ERR_STREAM_INCOMPLETE, t.buf);
    dk_send_sample_done(sample, DK_ERR_STREAM_INCOMPLETE, 0u, s->seq);
    return;
  }
  ev->sample = sample;
  ev->seq = s->seq;
}

static void end_frame(dk_stream_t *s, dk_stream_event_t *ev) {
  const uint32_t crc = get_u32(s->head); /* the CRC bytes are collected into head */
  if (crc != s->crc) {
    if (s->writing) {
      /* What this chunk wrote is void, and so is everything after its offset. */
      dk_stream_input_t *in = &s->inputs[s->index];
      if (in->received > s->offset) in->received = s->offset;
    }
    text_t t = {{0}, 0u};
    put_frame(&t, s);
    put_str(&t, " (");
    put_u32(&t, s->length);
    put_str(&t, " bytes): CRC mismatch");
    dk_send_error(DK_ERR_STREAM_CRC, t.buf);
    s->rejected++;
  } else if (s->reject) {
    send_reject(s);
  } else if (s->type == DK_HOST_INPUT) {
    const uint32_t sample = frame_sample(s);
    if (sample != s->sample) { /* the first chunk of another sample (at offset 0) */
      for (uint16_t i = 0u; i < s->count; ++i) s->inputs[i].received = 0u;
      s->sample = sample;
    }
    s->inputs[frame_index(s)].received = frame_offset(s) + (s->length - s->fixed_len);
  } else if (s->type == DK_HOST_RUN) {
    run_frame(s, ev);
  } else {
    ev->kind = DK_STREAM_END;
  }
  hunt(s);
}

void dk_stream_init(dk_stream_t *s, dk_stream_input_t *inputs, uint16_t count) {
  memset(s, 0, sizeof *s);
  s->inputs = inputs;
  s->count = count;
  s->sample = UINT32_MAX;
  for (uint16_t i = 0u; i < count; ++i) inputs[i].received = 0u;
}

void dk_stream_ran(dk_stream_t *s, uint32_t sample) {
  s->done_sample = sample;
  s->done_valid = 1u;
  for (uint16_t i = 0u; i < s->count; ++i) s->inputs[i].received = 0u;
}

size_t dk_stream_feed(dk_stream_t *s, const void *data, size_t len, dk_stream_event_t *ev) {
  static const uint8_t magic[3] = {0xA5u, (uint8_t)'D', (uint8_t)'K'};
  const uint8_t *p = (const uint8_t *)data;
  size_t i = 0u;
  ev->kind = DK_STREAM_NONE;
  while (i < len && ev->kind == DK_STREAM_NONE) {
    switch (s->state) {
      case ST_HUNT: {
        const uint8_t b = p[i++];
        if (b == magic[s->got]) {
          if (++s->got == sizeof magic) {
            s->state = ST_HEAD;
            s->got = 0u;
          }
        } else {
          s->got = b == magic[0] ? 1u : 0u;
        }
        break;
      }
      case ST_HEAD:
        s->head[s->got++] = p[i++];
        if (s->got == 1u && s->head[0] != DK_STREAM_VERSION) {
          text_t t = {{0}, 0u};
          put_str(&t, "host frame of protocol version ");
          put_u32(&t, s->head[0]);
          put_str(&t, ", this firmware speaks 1");
          dk_send_error(DK_ERR_STREAM_VERSION, t.buf);
          s->rejected++;
          hunt(s);
          if (s->head[0] == magic[0]) s->got = 1u; /* it may start the next frame */
        } else if (s->got == HEAD_BYTES) {
          begin_payload(s);
        }
        break;
      case ST_FIXED: {
        size_t n = s->fixed_len - s->got;
        if (n > len - i) n = len - i;
        memcpy(s->fixed + s->got, p + i, n);
        s->crc = dk_crc32(s->crc, p + i, n);
        s->got += (uint32_t)n;
        s->body += (uint32_t)n;
        i += n;
        if (s->type == DK_HOST_INPUT && s->got == 8u && s->fixed_len == 8u) {
          /* ndim is known: the rest of the header (sizes, offset) follows */
          const uint8_t ndim = frame_ndim(s);
          s->fixed_len = DK_STREAM_INPUT_HEAD(ndim);
          if (ndim > DK_STREAM_MAX_NDIM || s->length < s->fixed_len) {
            s->reject = ndim > DK_STREAM_MAX_NDIM ? DK_ERR_STREAM_SHAPE : DK_ERR_STREAM_LENGTH;
            s->state = ST_DATA; /* consume the rest unread */
            break;
          }
        }
        if (s->got == s->fixed_len) end_fixed(s);
        break;
      }
      case ST_DATA: {
        size_t n = s->length - s->body;
        if (n > len - i) n = len - i;
        if (s->writing)
          memcpy(s->inputs[s->index].data + s->offset + (s->body - s->fixed_len), p + i, n);
        s->crc = dk_crc32(s->crc, p + i, n);
        s->body += (uint32_t)n;
        i += n;
        if (s->body == s->length) {
          s->state = ST_CRC;
          s->got = 0u;
        }
        break;
      }
      default: /* ST_CRC: collected into head, which is no longer needed */
        s->head[s->got++] = p[i++];
        if (s->got == 4u) end_frame(s, ev);
        break;
    }
  }
  return i;
}
