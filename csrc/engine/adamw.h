/* adamw.h: AdamW over a model's flat buffers, its state on the model's device
 * or offloaded to the host pool.
 *
 * State, reserved at construction through the caching allocators and counted in
 * the model's memory plans (flat.optimizer_bytes on the device,
 * flat.optimizer_host_bytes in the host pool):
 *   m, v       (n) fp32   first and second moments
 *   master     (n) fp32   master weights; on the device with float32 parameters
 *                         the parameters themselves (no copy, so a
 *                         load_state_dict of the model after construction is
 *                         never undone by a stale master)
 *   ema        (n) fp32   optional exponential moving average of the weights
 *   segments   (count)    the tensors of the flat buffers: offset, numel, decay
 *                         (decay: the tensors chosen at construction; by default
 *                         those of 2+ dims)
 *   workspace  (PXT_SUMSQ_PARTS) double on the device: the norm's partial sums
 * n is the flat length, padding included: padding is in no segment, so it is
 * never read nor written by the update (and stays zero).
 *
 * A step is two passes through the backend table: grad_sumsq (global norm and
 * the finite check, deterministic), then adamw (unscale, clip, decoupled weight
 * decay on the chosen tensors, bias-corrected moments, master, EMA, the
 * compute-precision parameters); the scalars of the update are computed here,
 * on the host in double, rounded to float once. With non-finite gradients the
 * step is skipped before anything changes (and with loss scaling the scale
 * halves). The conditioning path's tensors are left alone by a step whose
 * gradients never reached them (pxt_flat.cond_grads).
 *
 * Offloaded (ZeRO-Offload's placement): m, v, the master (for every dtype) and
 * the EMA live in the host pool, and the device keeps only the parameters, the
 * gradients and the norm's workspace. grad_sumsq still runs on the device; the
 * update is the CPU backend's adamw over the host state, chunk by chunk: each
 * chunk's gradients come down into pinned staging, the CPU updates its state
 * and writes the chunk's compute-precision parameters into staging, and those
 * go up (see adamw.c for the overlap). The update being elementwise, chunking
 * changes no bit: an offloaded step gives the CPU backend's bits, and where the
 * device's adamw reproduces the CPU's (cuda/optim.cu), the on-device step's. */
#ifndef PXT_ADAMW_H
#define PXT_ADAMW_H

#include "flat.h"

/* The dynamic loss scale never grows past 2**24: there a gradient of 1 already
 * overflows float16 256 times over, and without a cap a run of clean (or zero)
 * gradients doubles it to inf. */
#define PXT_MAX_LOSS_SCALE 16777216.0

/* Elements per staged chunk of an offloaded step by default: 4 MiB of fp32
 * gradients, large enough for a copy engine's full speed and small enough that the
 * four staging buffers (12 MiB in bf16) stay in the CPU's last-level cache between
 * the copy that fills one and the update that reads it. */
#define PXT_OFFLOAD_CHUNK ((size_t)1 << 20)

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_clip;          /* 0: off */
    double ema_decay;          /* used with an EMA */
    int scaling;               /* dynamic loss scaling on */
    double scale;              /* current loss scale */
    long long growth_interval; /* clean steps before the scale doubles */
} pxt_adamw_hparams;

/* Where the state lives. */
typedef struct {
    int offload;  /* 1: in the host pool, stepped by the CPU backend */
    size_t chunk; /* offload: elements per staged chunk (0: PXT_OFFLOAD_CHUNK) */
} pxt_adamw_placement;

typedef struct {
    pxt_flat *flat; /* the model's flat state (its owner outlives this) */
    pxt_adamw_hparams h;
    size_t n; /* elements of the flat buffers, padding included */
    int n_segments;
    int offload;            /* state in the host pool (pxt_adamw_placement) */
    size_t chunk;           /* offload: elements per staged chunk, <= n */
    pxt_storage *m, *v;     /* (n) fp32, on the device or in the host pool */
    pxt_storage *master;    /* (n) fp32, or NULL: the fp32 parameters are the master */
    pxt_storage *ema;       /* (n) fp32, or NULL without an EMA */
    pxt_storage *segments;  /* (n_segments) pxt_adamw_segment on the device; offload: in
                              the host pool, then (n_segments) more for one chunk's */
    unsigned char *decay;   /* (n_segments) host: 1 where weight decay applies */
    pxt_storage *workspace; /* (PXT_SUMSQ_PARTS) double, on the device */
    pxt_storage *stage;     /* offload, host pool: gradients (2, chunk) fp32, then
                               parameters (2, chunk) dt, each 256-byte aligned */
    long long good_steps;   /* clean steps since the scale last changed */
    long long step;         /* updates applied (skipped steps do not count) */
    int swapped;            /* the model's parameters hold the EMA (swap_ema) */
    size_t state_bytes;     /* device allocator bytes (its blocks' sizes), added to
                               flat->optimizer_bytes */
    size_t host_bytes;      /* host pool bytes (its blocks' sizes), added to
                               flat->optimizer_host_bytes */
} pxt_adamw;

/* What one step did. */
typedef struct {
    double sumsq;  /* sum of squared (scaled) gradients */
    int nonfinite; /* an inf or NaN gradient: the update was skipped */
    int applied;
    double grad_norm; /* unscaled; inf or NaN when non-finite */
} pxt_adamw_result;

/* Allocator bytes of an AdamW's state for a flat buffer of numel elements in
 * n_tensors tensors, parameters of dtype dt, with or without an EMA: on the
 * model's device and in the host pool. pxt_adamw_plan replays the requests of
 * pxt_adamw_init, in its order, through plan allocators (alloc.h) of the
 * model's device (dev) and of the host pool (host; used only offloaded), which
 * it leaves holding the state's blocks. */
typedef struct {
    size_t device, host;
} pxt_adamw_bytes;
int pxt_adamw_plan(pxt_allocator *dev, pxt_allocator *host, size_t numel, int n_tensors,
                   pxt_dtype dt, int ema, const pxt_adamw_placement *where, pxt_adamw_bytes *out);

/* The rules that keep one step finite (PXT_ERR_VALUE naming `name`, else PXT_OK):
 * lr * weight_decay <= 1, and lr times the bound of Adam's normalised update for
 * the betas at most half the largest value of dt (see adamw.c). */
int pxt_adamw_check_hparams(const pxt_adamw_hparams *h, pxt_dtype dt, const char *name);
/* Moments an AdamW can have made with betas (b1, b2): v >= 0, and m within what
 * v allows (PXT_ERR_VALUE naming the first element that is not, else PXT_OK). */
int pxt_adamw_check_moments(const float *m, const float *v, size_t n, double b1, double b2);

/* Reserves the state over f where `where` says (NULL: on f's device), fills it
 * (moments 0, master and EMA from the parameters) and adds its bytes to f's
 * plans. decay (f->layout.count flags, copied) says which tensors weight decay
 * applies to; NULL: the layout's choice (tensors of 2+ dims). PXT_ERR_* with
 * nothing reserved. */
int pxt_adamw_init(pxt_adamw *o, pxt_flat *f, const pxt_adamw_hparams *h, int ema,
                   const unsigned char *decay, const pxt_adamw_placement *where);
void pxt_adamw_free(pxt_adamw *o);

/* The passes of one step; then pxt_adamw_account updates the step count and
 * the loss scale from r (kept apart so the passes can run without a lock on
 * the counters). */
int pxt_adamw_run(pxt_adamw *o, pxt_adamw_result *r);
void pxt_adamw_account(pxt_adamw *o, pxt_adamw_result *r);

/* Exchanges the model's parameters and the EMA; again to swap back. */
int pxt_adamw_swap_ema(pxt_adamw *o);

/* Host arrays of n floats into m, v, the master (the parameters in fp32, then
 * the 16-bit parameters from it) and, with an EMA, ema. */
int pxt_adamw_load(pxt_adamw *o, const float *m, const float *v, const float *master,
                   const float *ema);

#endif /* PXT_ADAMW_H */
