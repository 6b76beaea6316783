/* dk_link.c: the device side of the serial link (dk_link.h, docs/pico2.md). Portable C11. */
#include "dk_link.h"

#include <stdatomic.h>
#include <string.h>

static const dk_link_port_t *g_port;
static uint8_t *g_buf;
static size_t g_cap;
static size_t g_len;      /* valid transcript bytes */
static int g_session;     /* a REQUEST was answered: the host is reading */
static size_t g_sent;     /* transcript bytes sent since the last SYNC */
static uint8_t g_nonce[4];
static int g_acked;
static int g_finished;    /* `done` is in the transcript */
static int g_fault_mode;
static uint64_t g_complete_us; /* when the whole finished transcript was last sent */
static uint32_t g_repeats;     /* repeats in this session */
static int g_pending;          /* a REQUEST arrived and is not answered yet */
static uint8_t g_pending_nonce[4];
static uint8_t g_rx[DK_LINK_FRAME_BYTES];
static size_t g_rx_n;
static dk_link_stats_t g_stats;
/* Inside the link: dk_link_service (an interrupt) must not enter. */
static volatile int g_busy;
#if DK_SERVE
static int g_live;             /* a host frame arrived: writes go out, not to the transcript */
static uint8_t g_fm;           /* bytes of a host frame's magic matched */
static uint8_t g_fh[9];        /* the frame's header after the magic: version..length */
static uint8_t g_fh_n;         /* header bytes seen; 9: inside the payload */
static uint32_t g_frame_left;  /* payload and CRC bytes of the current frame still to come */
static uint8_t g_ring[DK_LINK_RX_BYTES];
static size_t g_ring_head, g_ring_len;
#endif

/* Marks the link busy and returns what it was before (for nested entries). The fences keep the
 * compiler from moving the link's state accesses across the flag; a single core needs no more
 * (the interrupt runs to completion before the code it interrupted continues). */
static int dk_link_enter(void) {
  const int was = g_busy;
  g_busy = 1;
  atomic_signal_fence(memory_order_seq_cst);
  return was;
}

static void dk_link_leave(int was) {
  atomic_signal_fence(memory_order_seq_cst);
  g_busy = was;
}

void dk_link_init(const dk_link_port_t *port, uint8_t *transcript, size_t capacity, size_t used) {
  g_port = port;
  g_buf = transcript;
  g_cap = capacity;
  g_len = used <= capacity ? used : capacity;
  g_session = g_acked = g_pending = g_fault_mode = 0;
  g_finished = used > 0; /* a saved transcript (fault reboot) is complete */
  g_sent = 0;
  g_rx_n = 0;
  g_repeats = 0;
  g_complete_us = 0;
  memset(&g_stats, 0, sizeof g_stats);
#if DK_SERVE
  g_live = 0;
  g_fm = g_fh_n = 0;
  g_frame_left = 0;
  g_ring_head = g_ring_len = 0;
#endif
}

/* One received byte through the REQUEST/ACK recognizer. */
static void dk_link_marker_byte(uint8_t b) {
  static const uint8_t marker[3] = {DK_LINK_MARK0, DK_LINK_MARK1, DK_LINK_MARK2};
  if (g_rx_n < 3u) {
    if (b == marker[g_rx_n]) {
      g_rx[g_rx_n++] = b;
    } else {
      g_rx_n = (b == marker[0]) ? 1u : 0u;
      g_rx[0] = b;
    }
    return;
  }
  if (g_rx_n == 3u) {
    if (b == DK_LINK_CMD_REQUEST || b == DK_LINK_CMD_ACK) {
      g_rx[g_rx_n++] = b;
    } else {
      g_rx_n = (b == marker[0]) ? 1u : 0u;
      g_rx[0] = b;
    }
    return;
  }
  g_rx[g_rx_n++] = b;
  if (g_rx_n < DK_LINK_FRAME_BYTES) return;
  g_rx_n = 0;
  if (g_rx[3] == DK_LINK_CMD_REQUEST) {
    g_pending = 1; /* only the last of several queued requests is answered */
    memcpy(g_pending_nonce, &g_rx[4], 4);
  } else if (g_session && memcmp(&g_rx[4], g_nonce, 4) == 0) {
    if (!g_acked) g_stats.acks++;
    g_acked = 1;
  }
}

#if DK_SERVE
static void dk_link_ring_put(uint8_t b) {
  if (g_ring_len == DK_LINK_RX_BYTES) return; /* cannot happen (dk_link_room) */
  g_ring[(g_ring_head + g_ring_len) % DK_LINK_RX_BYTES] = b;
  g_ring_len++;
}

/* Serve firmware: the bytes of a host frame, from its magic to its CRC, go to the firmware's
 * ring and never through the REQUEST/ACK recognizer (the frame takes priority); every other
 * byte goes through the recognizer only (the firmware's parser would skip it anyway). */
static void dk_link_rx_byte(uint8_t b) {
  static const uint8_t magic[3] = {0xA5u, (uint8_t)'D', (uint8_t)'K'};
  if (g_fm == 3u) { /* inside a frame */
    dk_link_ring_put(b);
    if (g_fh_n < sizeof g_fh) {
      g_fh[g_fh_n++] = b;
      if (g_fh_n == sizeof g_fh) {
        const uint32_t len = (uint32_t)g_fh[5] | (uint32_t)g_fh[6] << 8 |
                             (uint32_t)g_fh[7] << 16 | (uint32_t)g_fh[8] << 24;
        g_frame_left = len <= 65536u ? len + 4u : 0u; /* a bogus length ends it here */
        if (g_frame_left == 0u) g_fm = 0u;
      }
    } else if (--g_frame_left == 0u) {
      g_fm = 0u;
    }
    return;
  }
  if (b == magic[g_fm]) {
    if (++g_fm == 3u) { /* a host frame: its magic, then its bytes, are the firmware's */
      for (size_t i = 0; i < sizeof magic; ++i) dk_link_ring_put(magic[i]);
      g_fh_n = 0u;
      g_rx_n = 0u;
      g_live = 1;
      g_stats.frames++;
      return;
    }
  } else {
    g_fm = b == magic[0] ? 1u : 0u;
  }
  dk_link_marker_byte(b);
}

/* How many bytes to read from the port: n bytes put at most n + 2 per frame they start (a
 * frame's magic goes in whole when its third byte arrives; a frame is 16 bytes at least) into
 * the ring, so half its room is always safe. */
static size_t dk_link_room(size_t want) {
  const size_t room = DK_LINK_RX_BYTES - g_ring_len;
  if (room < 8u) return 0u;
  return room / 2u < want ? room / 2u : want;
}
#else
static void dk_link_rx_byte(uint8_t b) { dk_link_marker_byte(b); }
static size_t dk_link_room(size_t want) { return want; }
#endif

static void dk_link_read_input(void) {
  uint8_t in[64];
  for (unsigned round = 0; round < 16u; ++round) {
    const size_t want = dk_link_room(sizeof in);
    if (want == 0u) break;
    const size_t n = g_port->read(in, want);
    if (n == 0u) break;
    for (size_t i = 0; i < n; ++i) dk_link_rx_byte(in[i]);
  }
}

static void dk_link_send_sync(void) {
  uint8_t frame[DK_LINK_FRAME_BYTES] = {DK_LINK_MARK0, DK_LINK_MARK1, DK_LINK_MARK2,
                                        DK_LINK_CMD_SYNC};
  memcpy(&frame[4], g_nonce, 4);
  g_port->write(frame, sizeof frame);
  g_sent = 0;
}

/* Answers a pending REQUEST: a new session that starts from the transcript's first byte. */
static void dk_link_answer(void) {
  if (!g_pending) return;
  g_pending = 0;
  memcpy(g_nonce, g_pending_nonce, 4);
  g_session = 1;
  g_acked = 0;
  g_repeats = 0;
  g_stats.requests++;
  dk_link_send_sync();
}

/* Sends the transcript bytes this session has not sent yet. */
static void dk_link_pump(void) {
  while (g_session && g_sent < g_len) {
    size_t n = g_len - g_sent;
    if (n > DK_LINK_CHUNK_BYTES) n = DK_LINK_CHUNK_BYTES;
    g_port->write(g_buf + g_sent, n);
    g_sent += n;
    dk_link_read_input();
    dk_link_answer(); /* a new request restarts from the first byte */
  }
  if (g_session && g_finished && g_sent == g_len && g_complete_us == 0u)
    g_complete_us = g_port->now_us();
}

static void dk_link_poll_inside(void) {
  dk_link_read_input();
  if (g_pending) {
    dk_link_answer();
    g_complete_us = 0u;
  }
  dk_link_pump();
#if DK_SERVE
  if (g_live) return; /* the answers went out live; the stream protocol asks again itself */
#endif
  if (g_finished && g_session && !g_acked && g_sent == g_len && g_repeats < DK_LINK_MAX_REPEATS &&
      g_complete_us != 0u &&
      g_port->now_us() - g_complete_us >= (uint64_t)DK_LINK_REPEAT_MS * 1000u) {
    /* No ACK: the response may have been lost. Send it all again. */
    g_repeats++;
    g_stats.repeats++;
    g_complete_us = 0u;
    dk_link_send_sync();
    dk_link_pump();
  }
}

void dk_link_poll(void) {
  if (g_port == NULL || g_fault_mode) return;
  const int was = dk_link_enter();
  dk_link_poll_inside();
  dk_link_leave(was);
}

int dk_link_service(void) {
  if (g_port == NULL || g_fault_mode) return 0;
  if (g_busy) {
    g_stats.deferred++;
    return 0;
  }
  const int was = dk_link_enter();
  g_stats.serviced++;
  dk_link_poll_inside();
  dk_link_leave(was);
  return 1;
}

void dk_link_write(const void *data, size_t len) {
  const uint8_t *p = (const uint8_t *)data;
  if (g_buf == NULL) return;
  size_t fit = g_cap - g_len;
  if (fit > len) fit = len;
  if (g_fault_mode) { /* no I/O from fault context; the rest is lost */
    memcpy(g_buf + g_len, p, fit);
    g_len += fit;
    return;
  }
  const int was = dk_link_enter();
#if DK_SERVE
  if (g_live) { /* a serve session is on: out at once, not kept */
    dk_link_poll_inside();
    if (g_session) {
      dk_link_pump();
      g_port->write(p, len);
    }
    dk_link_leave(was);
    return;
  }
#endif
  memcpy(g_buf + g_len, p, fit);
  g_len += fit;
  if (fit == len) {
    dk_link_poll_inside();
    dk_link_leave(was);
    return;
  }
  /* The transcript is full: wait for a host, then send the stored part and this rest live. */
  g_stats.overflow += (uint32_t)(len - fit);
  while (!g_session) {
    dk_link_read_input();
    dk_link_answer();
    if (!g_session) g_port->idle();
  }
  dk_link_pump();
  g_port->write(p + fit, len - fit);
  dk_link_leave(was);
}

void dk_link_finish(void) {
  const int was = dk_link_enter();
  g_finished = 1;
  g_complete_us = 0u;
  dk_link_leave(was);
}

void dk_link_serve_forever(void) {
  dk_link_finish();
  for (;;) {
    dk_link_poll();
    g_port->idle();
  }
}

#if DK_SERVE
size_t dk_link_read(void *buf, size_t len) {
  if (g_port == NULL || g_fault_mode) return 0u;
  const int was = dk_link_enter();
  if (g_ring_len == 0u) dk_link_poll_inside();
  uint8_t *out = (uint8_t *)buf;
  size_t n = 0u;
  while (n < len && g_ring_len) {
    out[n++] = g_ring[g_ring_head];
    g_ring_head = (g_ring_head + 1u) % DK_LINK_RX_BYTES;
    g_ring_len--;
  }
  dk_link_leave(was);
  return n;
}
#endif

void dk_link_enter_fault_mode(void) { g_fault_mode = 1; }

const uint8_t *dk_link_transcript(size_t *used) {
  if (used) *used = g_len;
  return g_buf;
}

const dk_link_stats_t *dk_link_get_stats(void) { return &g_stats; }
