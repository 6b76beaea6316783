/*
 * dk_link.h: the device side of deploykit's serial link for boards whose console is a USB CDC
 * port (docs/pico2.md, "The USB CDC connect race").
 *
 * A USB CDC device drops what it writes while no host has the port open, and the host opens
 * the port only after the board has enumerated, which can be after the results were produced.
 * So nothing goes out unasked. Every byte of the result protocol is kept in a RAM transcript;
 * the host asks for it, and the device answers with a sync marker followed by the whole
 * transcript from its first byte, then streams what is written later:
 *
 *   host   -> device  REQUEST  16 'D' 'K' 'R' n0 n1 n2 n3   (send everything, from the start)
 *   device -> host    SYNC     16 'D' 'K' 'S' n0 n1 n2 n3   then transcript[0..], then live
 *   host   -> device  ACK      16 'D' 'K' 'A' n0 n1 n2 n3   (done received; stop repeating)
 *
 * n0..n3 is a nonce the host picks per request; the host discards every byte before the SYNC
 * that echoes one of its nonces (stale bytes of an earlier session), and a later SYNC restarts
 * its decoder. The host repeats REQUEST until it sees SYNC (the board may still be booting or
 * busy). After `done`, the device repeats SYNC + transcript every DK_LINK_REPEAT_MS until the
 * ACK arrives (at most DK_LINK_MAX_REPEATS times per request), so a response lost in transit is
 * sent again. A new REQUEST at any time, even long after the run, gets everything again.
 *
 * The transcript holds DK_LINK_TRANSCRIPT_BYTES. When a write would overflow it, the writer
 * waits for a host request, sends what is stored and then the rest live: nothing is lost on
 * the first session, but later requests get only the stored prefix (the host then reports a
 * truncated stream rather than wrong results).
 *
 * The link is also serviced from a timer interrupt (dk_link_service), so a program that hangs
 * (in execute(), say) still answers a REQUEST and streams what it wrote before. The interrupt
 * must not enter the link while the main thread is inside it: every entry point marks the link
 * busy, and dk_link_service does nothing (and counts a deferral) while it is. A flag, not a
 * lock: the interrupt never waits, so it cannot deadlock, and the main thread, which it
 * interrupted, polls again itself as soon as it writes.
 *
 * Serve firmware (DK_SERVE; docs/pico2.md "Serve firmware on the link") takes samples as host
 * frames (docs/protocol.md "Host -> device") on the same port. The link tracks them: the bytes
 * of a host frame (magic A5 'D' 'K', its header, its length's payload and CRC) go to the
 * firmware (dk_link_read) and bypass the REQUEST/ACK recognizer, so a 16 'D' 'K' inside a
 * sample's data is data, not a command; every other byte goes to the recognizer as before.
 * Frame bytes wait in a small ring until the firmware reads them (also those read from the
 * timer tick before the firmware's first read), and while it is full the link reads no more
 * from the port (USB holds the bytes; the host sends a sample and waits). The first host frame
 * also makes the link live-only: what the firmware writes from then on (the answers, sample
 * after sample) goes out at once and is not kept, so a long session never fills the
 * transcript; the transcript keeps what came before (hello, ready), which a new REQUEST still
 * gets, and the stream protocol itself asks again for a lost answer, so nothing is repeated
 * after done. A fault report is appended to the transcript as ever (and served after the
 * reboot with hello and ready before it).
 *
 * The code is portable C11: the port (read, write, clock, idle) is given by the board, so the
 * same file runs on the RP2350 and, in the host tests, on a pty (with a signal as the timer
 * interrupt).
 */
#ifndef DK_LINK_H
#define DK_LINK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DK_LINK_MARK0 0x16u /* ASCII SYN */
#define DK_LINK_MARK1 'D'
#define DK_LINK_MARK2 'K'
#define DK_LINK_CMD_REQUEST 'R'
#define DK_LINK_CMD_ACK 'A'
#define DK_LINK_CMD_SYNC 'S'
#define DK_LINK_FRAME_BYTES 8u /* 4 marker bytes + 4 nonce bytes */

#ifndef DK_LINK_REPEAT_MS
#define DK_LINK_REPEAT_MS 1000u
#endif
#ifndef DK_LINK_MAX_REPEATS
#define DK_LINK_MAX_REPEATS 10u
#endif
/* Bytes per write() call while sending the transcript; host input is checked between them. */
#ifndef DK_LINK_CHUNK_BYTES
#define DK_LINK_CHUNK_BYTES 256u
#endif
#if DK_SERVE
/* Host bytes kept for the firmware until it reads them (dk_link_read); while it is full, the
 * link reads no more from the port (USB holds them; the host sends a sample and waits). */
#ifndef DK_LINK_RX_BYTES
#define DK_LINK_RX_BYTES 64u
#endif
#endif

typedef struct dk_link_port {
  /* Non-blocking: copies at most `len` received bytes into `buf`, returns how many. */
  size_t (*read)(void *buf, size_t len);
  /* Sends `len` bytes (may drop them when no host is connected, like USB CDC does). */
  void (*write)(const void *buf, size_t len);
  /* Monotonic microseconds. */
  uint64_t (*now_us)(void);
  /* Called while waiting for the host; services the transport if it needs polling. */
  void (*idle)(void);
} dk_link_port_t;

typedef struct dk_link_stats {
  uint32_t requests;  /* REQUESTs answered */
  uint32_t acks;      /* ACKs matching the current session */
  uint32_t repeats;   /* transcript repeats after done, all sessions */
  uint32_t overflow;  /* bytes written past the transcript's end (sent live only) */
  uint32_t serviced;  /* dk_link_service calls that polled */
  uint32_t deferred;  /* dk_link_service calls that found the main thread inside the link */
#if DK_SERVE
  uint32_t frames; /* host frames seen */
#endif
} dk_link_stats_t;

/* Starts the link over `port` with `transcript` (capacity bytes) as the record store; `used`
 * bytes of it are already valid (0 normally; a saved transcript after a fault reboot). */
void dk_link_init(const dk_link_port_t *port, uint8_t *transcript, size_t capacity, size_t used);

/* Appends result-protocol bytes: kept in the transcript and, during a session, sent at once. */
void dk_link_write(const void *data, size_t len);

/* Handles host input (REQUEST, ACK) and sends pending transcript bytes. Never blocks long. */
void dk_link_poll(void);

/* For a timer interrupt: polls the link unless the interrupted code is inside it (then it
 * returns 0 and the next tick tries again). Never blocks on the main thread. */
int dk_link_service(void);

/* Marks the transcript complete (`done` sent): from now on the link repeats it until ACKed. */
void dk_link_finish(void);

/* Polls forever: the end of every program on a link board. */
#if defined(__GNUC__)
__attribute__((noreturn))
#endif
void dk_link_serve_forever(void);

#if DK_SERVE
/* Serve firmware: non-blocking, copies at most `len` bytes of host frames into `buf` (polling
 * the port when none are kept), returns how many. */
size_t dk_link_read(void *buf, size_t len);
#endif

/* Fault context: stop all I/O; later writes only append to the transcript. */
void dk_link_enter_fault_mode(void);

/* The transcript and its valid length (for saving it across a reboot). */
const uint8_t *dk_link_transcript(size_t *used);

const dk_link_stats_t *dk_link_get_stats(void);

#ifdef __cplusplus
}
#endif

#endif /* DK_LINK_H */
