/*
 * serve_standin.c: serve firmware's loop with a stand-in model, compiled for the host by the
 * tests (tests/unit/test_stream_parser.py, tests/unit/test_serial_port.py).
 *
 * The device side is firmware/protocol/dk_stream.c and dk_protocol.c, as serve firmware runs
 * them (and, with -DSTANDIN_LINK=1, firmware/boards/rp2350/dk_link.c on a pty, as the Pico 2
 * runs it); only the model is a stand-in, and it is defined here so that the host can compute
 * what the device must answer:
 *
 *   input 0   float32 logical [1, 2, 3], dim order [0, 2, 1] (its bytes are [1, 3, 2])
 *   input 1   int8 [5]
 *   output 0  float32 logical [1, 2, 3], dim order [0, 2, 1]: input 0 times 2, element-wise
 *   output 1  int32 [1]: the sum of input 1
 *
 * The loop is runner.cpp's serve loop: read the console, feed the parser, and on its events
 * execute (send the outputs and sample_done), answer again (replay), or end (timing, memory,
 * done). argv: `chunk=N` feeds the parser N bytes at a time (1: byte by byte); with the link,
 * the first argument is the pty's fd, `flip_in=N` / `flip_out=N` damage byte N of what the
 * device reads / writes on the wire (counted from the start), `poll_ms=N` has the link polled
 * (as the Pico's timer tick does) for N ms after `ready` before the loop first reads, and the
 * link's counters are printed on stdout at the end.
 */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dk_errors.h"
#include "dk_protocol.h"
#include "dk_stream.h"
#if STANDIN_LINK
#include "dk_link.h"
#endif

static const int32_t in0_sizes[3] = {1, 2, 3};
static const uint8_t in0_order[3] = {0, 2, 1};
static const int32_t in1_sizes[1] = {5};
static const uint8_t in1_order[1] = {0};
static const int32_t out1_sizes[1] = {1};

static float in0[6];
static int8_t in1[5];
static float out0[6];
static int32_t out1[1];

static long opt(int argc, char **argv, const char *key, long dflt) {
  size_t k = strlen(key);
  for (int i = 1; i < argc; ++i)
    if (!strncmp(argv[i], key, k) && argv[i][k] == '=') return strtol(argv[i] + k + 1, 0, 0);
  return dflt;
}

#if STANDIN_LINK
static int fd;
static long flip_in = -1, flip_out = -1, read_total, written_total;
static size_t port_read(void *buf, size_t len) {
  ssize_t n = read(fd, buf, len);
  if (n <= 0) return 0u;
  if (flip_in >= read_total && flip_in < read_total + n) ((uint8_t *)buf)[flip_in - read_total] ^= 0x40u;
  read_total += n;
  return (size_t)n;
}
static void port_write(const void *buf, size_t len) {
  unsigned char copy[512];
  const unsigned char *p = buf;
  if (flip_out >= written_total && flip_out < written_total + (long)len && len <= sizeof copy) {
    memcpy(copy, buf, len);
    copy[flip_out - written_total] ^= 0x40u;
    p = copy;
  }
  written_total += (long)len;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n <= 0) {
      usleep(200);
      continue;
    }
    p += n;
    len -= (size_t)n;
  }
}
static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
static void idle(void) { usleep(200); }
static const dk_link_port_t port = {port_read, port_write, now_us, idle};
static uint8_t transcript[DK_LINK_TRANSCRIPT_BYTES];
void dk_console_write(const void *data, size_t len) { dk_link_write(data, len); }
static size_t console_read(void *buf, size_t len) { return dk_link_read(buf, len); }
static void console_wait(void) {
  dk_link_poll();
  idle();
}
#else
void dk_console_write(const void *data, size_t len) {
  fwrite(data, 1, len, stdout);
  fflush(stdout);
}
static size_t console_read(void *buf, size_t len) {
  ssize_t n = read(0, buf, len);
  if (n <= 0) exit(0); /* the host's script ended */
  return (size_t)n;
}
static void console_wait(void) {}
#endif

static void send_outputs(void) {
  dk_send_tensor(0, DK_DTYPE_FLOAT32, 3, in0_sizes, 0.0f, 0, out0, sizeof out0);
  dk_send_tensor(1, DK_DTYPE_INT32, 1, out1_sizes, 0.0f, 0, out1, sizeof out1);
}

int main(int argc, char **argv) {
#if STANDIN_LINK
  fd = atoi(argv[1]);
  flip_in = opt(argc, argv, "flip_in", -1);
  flip_out = opt(argc, argv, "flip_out", -1);
  dk_link_init(&port, transcript, sizeof transcript, 0u);
#endif
  dk_send_hello("protocol=1\nboard=standin\nfirmware=executorch-runner\nserve=1\n"
                "input_protocol=1");
  const dk_ready_tensor_t ready[] = {
      {DK_DTYPE_FLOAT32, 3, in0_sizes, in0_order, sizeof in0},
      {DK_DTYPE_INT8, 1, in1_sizes, in1_order, sizeof in1},
      {DK_DTYPE_FLOAT32, 3, in0_sizes, in0_order, sizeof out0},
      {DK_DTYPE_INT32, 1, out1_sizes, in1_order, sizeof out1},
  };
  dk_send_ready(ready, 2, 2);
#if STANDIN_LINK
  for (uint64_t end = now_us() + (uint64_t)opt(argc, argv, "poll_ms", 0) * 1000u; now_us() < end;)
    console_wait();
#endif
  dk_stream_input_t inputs[2] = {
      {DK_DTYPE_FLOAT32, 3, in0_sizes, (uint8_t *)in0, sizeof in0, 0},
      {DK_DTYPE_INT8, 1, in1_sizes, (uint8_t *)in1, sizeof in1, 0},
  };
  dk_stream_t stream;
  dk_stream_init(&stream, inputs, 2);
  const size_t chunk = (size_t)opt(argc, argv, "chunk", 4096);
  uint8_t rx[4096];
  size_t have = 0, pos = 0;
  uint64_t total_ticks = 0, last_ticks = 0;
  uint32_t runs = 0;
  for (;;) {
    if (pos == have) {
      have = console_read(rx, chunk < sizeof rx ? chunk : sizeof rx);
      pos = 0;
      if (have == 0) {
        console_wait();
        continue;
      }
    }
    dk_stream_event_t ev;
    pos += dk_stream_feed(&stream, rx + pos, have - pos, &ev);
    if (ev.kind == DK_STREAM_RUN) { /* "execute": ticks are the sample number, made up */
      for (int i = 0; i < 6; ++i) out0[i] = in0[i] * 2.0f;
      out1[0] = 0;
      for (int i = 0; i < 5; ++i) out1[0] += in1[i];
      last_ticks = 1000u + ev.sample;
      total_ticks += last_ticks;
      runs++;
      send_outputs();
      dk_send_sample_done(ev.sample, 0, last_ticks, ev.seq);
      dk_stream_ran(&stream, ev.sample);
    } else if (ev.kind == DK_STREAM_REPLAY) {
      send_outputs();
      dk_send_sample_done(ev.sample, 0, last_ticks, ev.seq);
    } else if (ev.kind == DK_STREAM_END) {
      dk_send_timing(total_ticks, 1000000u, runs, DK_INSTRUCTIONS_UNKNOWN);
      const dk_memory_entry_t mem[] = {{"stack", 100, 1000}};
      dk_send_memory(mem, 1);
      dk_send_done(DK_STATUS_OK);
#if STANDIN_LINK
      dk_link_finish();
      const uint64_t end = now_us() + (uint64_t)opt(argc, argv, "linger_ms", 3000) * 1000u;
      while (now_us() < end && !dk_link_get_stats()->acks) console_wait();
      const dk_link_stats_t *st = dk_link_get_stats();
      size_t kept = 0;
      (void)dk_link_transcript(&kept);
      printf("requests=%u acks=%u repeats=%u overflow=%u frames=%u kept=%zu\n", st->requests,
             st->acks, st->repeats, st->overflow, st->frames, kept);
#endif
      return 0;
    }
  }
}
