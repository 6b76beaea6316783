/*
 * dk_stream.h: the device side of the host -> device frames, version 1 (docs/protocol.md,
 * "Host -> device"), which serve firmware (DK_SERVE) receives on its console.
 *
 * A host frame has the result protocol's layout (magic A5 44 4B, version 1, type, flags, seq,
 * length, payload, CRC-32 of version..payload; little-endian), with types from 0x40:
 *
 *   0x40 input  u32 sample, u16 input, u8 dtype, u8 ndim, i32 sizes[ndim], u32 offset, data
 *   0x41 run    u32 sample
 *   0x42 end    (no payload)
 *
 * The parser takes the console's bytes in any chunking and writes an input frame's data straight
 * into that input's buffer as it arrives: nothing is staged, so its RAM is this struct whatever
 * the frame size. The CRC is known only at a frame's end, so a data byte is written before its
 * frame is known to be intact. The rules that keep that safe:
 *   - a chunk counts (the input's `received` grows to offset + its bytes) only once its CRC
 *     matched; a chunk whose CRC fails voids the input from its offset on;
 *   - a chunk is written only where nothing valid lies: at the input's next byte, or at 0 (the
 *     host sending the input again, or the first chunk of another sample, which voids what it
 *     overwrites), never past the input's end;
 *   - the header is checked before any byte is written: input index, dtype, rank, sizes, offset
 *     and the chunk's end against the input the method takes.
 * A rejected frame is consumed to its end (its length, when within the protocol's 65,536-byte
 * limit) and reported as an `error` record with a DK_ERR_STREAM_* code once its CRC says whether
 * the frame or the wire was wrong; the parser then hunts for the next magic and keeps serving.
 * Bytes between frames are skipped. A `run` of a sample whose inputs are not all complete gets
 * an error record and a `sample_done` with DK_ERR_STREAM_INCOMPLETE from the parser itself; a
 * `run` the runner has to act on comes back as an event, as does `end`.
 *
 * Portable C11 with no board dependency besides dk_protocol.h's encoder (errors and the
 * incomplete run's sample_done go out through it), so the same file is compiled on the host in
 * the unit tests and fed by the Python encoder of host frames
 * (tools/deploykit/readers/protocol/host_frames.py).
 */
#ifndef DK_STREAM_H
#define DK_STREAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DK_STREAM_VERSION 1u

/* Host frame types. */
enum { DK_HOST_INPUT = 0x40, DK_HOST_RUN = 0x41, DK_HOST_END = 0x42 };

/* The largest rank an input frame may describe (the parser keeps the header of one frame). */
#ifndef DK_STREAM_MAX_NDIM
#define DK_STREAM_MAX_NDIM 8u
#endif

/* The input frame's fixed part: sample, input, dtype, ndim (8), sizes (4 per dim), offset (4). */
#define DK_STREAM_INPUT_HEAD(ndim) (8u + 4u * (uint32_t)(ndim) + 4u)

/* One input of the method, as the runner describes it: where its bytes go (its memory order)
 * and what a frame must say about it. `received` is the parser's: bytes of the current sample
 * that arrived whole, from the start. */
typedef struct dk_stream_input {
  uint8_t dtype; /* ExecuTorch ScalarType code */
  uint8_t ndim;
  const int32_t *sizes;
  uint8_t *data;
  uint32_t nbytes;
  uint32_t received;
} dk_stream_input_t;

typedef enum dk_stream_event_kind {
  DK_STREAM_NONE = 0,
  DK_STREAM_RUN,    /* execute the sample: its inputs are complete */
  DK_STREAM_REPLAY, /* the host asks again for the sample executed last: send its answer again */
  DK_STREAM_END     /* end of the session: send the totals and done */
} dk_stream_event_kind_t;

typedef struct dk_stream_event {
  dk_stream_event_kind_t kind;
  uint32_t sample;
  uint16_t seq; /* the host's run frame, echoed in sample_done */
} dk_stream_event_t;

typedef struct dk_stream {
  dk_stream_input_t *inputs;
  uint16_t count;
  uint8_t state;
  uint8_t type;
  uint8_t head[9]; /* version, type, flags, seq, length */
  uint8_t fixed[DK_STREAM_INPUT_HEAD(DK_STREAM_MAX_NDIM)];
  uint8_t writing; /* the current frame's data goes to inputs[index] */
  uint8_t done_valid;
  uint16_t index;
  uint16_t seq;
  uint32_t got;       /* bytes of the current part (magic, header, fixed part, CRC) */
  uint32_t fixed_len; /* the fixed part of the current frame's payload */
  uint32_t length;    /* the current frame's payload length */
  uint32_t body;      /* payload bytes consumed */
  uint32_t crc;
  uint32_t offset;    /* the current chunk's offset in its input */
  uint32_t reject;    /* a DK_ERR_STREAM_* code to report once the CRC is checked; 0 none */
  uint32_t sample;    /* the sample whose bytes the inputs hold */
  uint32_t done_sample; /* the sample executed last (its outputs stand while done_valid) */
  uint32_t rejected;  /* frames rejected since init */
} dk_stream_t;

/* Starts the parser over the method's `count` inputs (their `received` is reset). */
void dk_stream_init(dk_stream_t *s, dk_stream_input_t *inputs, uint16_t count);

/* Feeds `len` console bytes. Stops after a frame that is an event for the runner (run, replay,
 * end) and returns the bytes consumed, with the event in *ev; otherwise consumes everything
 * and sets ev->kind to DK_STREAM_NONE. */
size_t dk_stream_feed(dk_stream_t *s, const void *data, size_t len, dk_stream_event_t *ev);

/* The runner executed `sample` (whatever the outcome): its answer stands until an input byte is
 * written again, and every input must be sent again for the next run (execute() may have
 * reused the inputs' memory). */
void dk_stream_ran(dk_stream_t *s, uint32_t sample);

#ifdef __cplusplus
}
#endif

#endif /* DK_STREAM_H */
