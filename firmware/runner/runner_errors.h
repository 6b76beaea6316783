/* runner_errors.h: the runner's own codes of the `error` record (docs/protocol.md). ExecuTorch
 * Error values (below 0x100) pass through unchanged; these start at 0x1001. */
#ifndef DK_RUNNER_ERRORS_H
#define DK_RUNNER_ERRORS_H

enum {
  DK_ERR_ABORT = 0x1001,        /* ExecuTorch called et_pal_abort() */
  DK_ERR_POOL = 0x1002,         /* a pool is too small (done status 3) */
  DK_ERR_INPUT = 0x1003,        /* model_io.h does not match the method's inputs */
  DK_ERR_OUTPUT_DTYPE = 0x1004, /* an output dtype the protocol cannot carry */
  DK_ERR_NOT_TENSOR = 0x1005,   /* an input or output that is not a tensor */
  DK_ERR_NO_BACKEND = 0x1006,   /* the program delegates to a backend this firmware lacks */
  DK_ERR_NO_NPU = 0x1007,       /* no Ethos-U answers at the board's NPU address */
  DK_ERR_NPU_INIT = 0x1008,     /* the Ethos-U driver did not initialise the NPU */
  DK_ERR_NPU_RUN = 0x1009       /* an NPU command stream failed or timed out */
};

#endif /* DK_RUNNER_ERRORS_H */
