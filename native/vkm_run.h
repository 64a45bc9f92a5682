/* vkm_run.h - a run of quiet kernel steps without the interpreter
 * (KernelRuntime.run's native path; src/vkmulti/kernels/engine/native_run.py
 * decides when a run may take it and makes the plan).
 *
 * A quiet step records the same operations every time (step_recorder.py's
 * quiet shape: outbox resets, the kernels' dispatches, their finish passes)
 * in the same rotation of command buffers: only the step number and the clock
 * in the push constants change. The plan of a device holds one template of
 * operations per step of the rotation (its `depth`, the in-flight regions);
 * each step stamps its template and records and submits it. Before a command
 * buffer (and the regions its step wrote) is used again, the step that used
 * it last must be done and must have been quiet: nothing sent, nothing for
 * the host, nothing consumed, nothing overflowed (`checks`, words of the
 * status and K2H rings that read 0). The first step that was not stops the
 * run: the host reads it back (the regions it wrote are not used again).
 * Calls take no lock but the queue's; the caller holds the device's step
 * lock and keeps every buffer the plan names alive.
 */
#ifndef VKM_RUN_H
#define VKM_RUN_H

#include "vkm.h"

#define VKM_RUN_MAX_DEPTH 8       /* in-flight regions of a device */
#define VKM_RUN_CLOCK_WORDS 3     /* an HLC stamp in a K2H header (words 6-8) */

/* What vkm_run_steps stopped at. */
enum {
    VKM_RUN_DONE = 0,        /* every step asked for was submitted */
    VKM_RUN_WAITING = 1,     /* the wait slice ran out before a step had room: call again */
    VKM_RUN_NOT_QUIET = 2,   /* a step that must be reused did something: the host reads it back */
    VKM_RUN_FAILED = 3       /* a Vulkan call failed (*result says which): the host takes over */
};

/* One kernel's stamps in a template: the byte offsets of its dispatch's and its
 * finish pass's records; its step number at the run's first step. */
typedef struct vkm_run_patch {
    uint32_t kernel_op;
    uint32_t finish_op;
    uint64_t step0;
} vkm_run_patch;

/* One word to copy when a checked step is found quiet: the clock a kernel's finish pass left. */
typedef struct vkm_run_capture {
    const volatile uint32_t *src;   /* VKM_RUN_CLOCK_WORDS words */
    uint32_t out;                   /* index into vkm_run_dev.clock / VKM_RUN_CLOCK_WORDS */
} vkm_run_capture;

typedef struct vkm_run_template {
    unsigned char *ops;       /* n records of VKM_STEP_OP_BYTES, checked once (vkm_step_check_ops) */
    size_t n;
    vkm_run_patch *patches;
    uint32_t npatches;
    const volatile uint32_t **checks;   /* words that read 0 after a quiet step of this template */
    uint32_t nchecks;
    vkm_run_capture *captures;
    uint32_t ncaptures;
} vkm_run_template;

typedef struct vkm_run_dev {
    const vkm_device *d;
    vkm_queue *q;
    VkSemaphore timeline;
    uint32_t depth;                           /* 1..VKM_RUN_MAX_DEPTH */
    VkCommandBuffer cmds[VKM_RUN_MAX_DEPTH];  /* by region */
    vkm_run_template templates[VKM_RUN_MAX_DEPTH];   /* by (step of the run) % depth */
    uint32_t region0;                         /* the region of the run's first step */
    uint64_t value0;                          /* the last value submitted before the run */
    uint64_t known;                           /* steps up to this value need no check (read back by the host) */
    uint64_t value;                           /* the last value submitted */
    uint64_t checked;                         /* steps up to this value were found done and quiet */
    uint32_t *clock;                          /* captured clocks (VKM_RUN_CLOCK_WORDS per kernel) */
    VkResult result;                          /* of the call that failed (VKM_RUN_FAILED) */
    uint32_t naps;                            /* wait for room by napping (vkm_nap_wait), not blocking */
    vkm_nap nap;                              /* the timeline's pace, as the naps learnt it */
} vkm_run_dev;

/* Submit steps value+1.. on every device of `devs`, step by step (all devices one
 * step, then the next), until each has submitted `until` steps of the run (counted
 * from value0), or: a wait for room took longer than `slice_ns` (VKM_RUN_WAITING,
 * *stalled the device), a step to reuse was not quiet (VKM_RUN_NOT_QUIET), a call
 * failed (VKM_RUN_FAILED, the device's result). Devices before the stalled or
 * failed one may be one step ahead of it. VKM_RUN_DONE also once vkm_now_ns() reaches
 * `deadline_ns` (0: none) between two steps, after one step at least. Without the GIL. */
int vkm_run_steps(vkm_run_dev *const *devs, uint32_t ndevs, uint64_t until, uint64_t slice_ns, uint64_t deadline_ns,
                  uint32_t *stalled);

#endif
