/* adamw.h: AdamW over a model's flat buffers.
 *
 * State, reserved at construction through the caching allocator on the
 * model's device and counted in the model's memory plans (flat.optimizer_bytes):
 *   m, v       (n) fp32   first and second moments
 *   master     (n) fp32   master weights; for a float32 model the parameters
 *                         themselves (no copy, so a load_state_dict of the model
 *                         after construction is never undone by a stale master)
 *   ema        (n) fp32   optional exponential moving average of the weights
 *   segments   (count)    the tensors of the flat buffers: offset, numel, decay
 *                         (decay: the tensors chosen at construction; by default
 *                         those of 2+ dims)
 *   workspace  (PXT_SUMSQ_PARTS) double: the partial sums of the norm
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
 * gradients never reached them (pxt_flat.cond_grads). */
#ifndef PXT_ADAMW_H
#define PXT_ADAMW_H

#include "flat.h"

/* The dynamic loss scale never grows past 2**24: there a gradient of 1 already
 * overflows float16 256 times over, and without a cap a run of clean (or zero)
 * gradients doubles it to inf. */
#define PXT_MAX_LOSS_SCALE 16777216.0

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_clip;          /* 0: off */
    double ema_decay;          /* used with an EMA */
    int scaling;               /* dynamic loss scaling on */
    double scale;              /* current loss scale */
    long long growth_interval; /* clean steps before the scale doubles */
} pxt_adamw_hparams;

typedef struct {
    pxt_flat *flat; /* the model's flat state (its owner outlives this) */
    pxt_adamw_hparams h;
    size_t n; /* elements of the flat buffers, padding included */
    int n_segments;
    pxt_storage *m, *v;     /* (n) fp32 */
    pxt_storage *master;    /* (n) fp32, or NULL: the fp32 parameters are the master */
    pxt_storage *ema;       /* (n) fp32, or NULL without an EMA */
    pxt_storage *segments;  /* (n_segments) pxt_adamw_segment */
    unsigned char *decay;   /* (n_segments) host: 1 where weight decay applies */
    pxt_storage *workspace; /* (PXT_SUMSQ_PARTS) double */
    long long good_steps;   /* clean steps since the scale last changed */
    long long step;         /* updates applied (skipped steps do not count) */
    int swapped;            /* the model's parameters hold the EMA (swap_ema) */
    size_t state_bytes;     /* allocator bytes, added to flat->optimizer_bytes */
} pxt_adamw;

/* What one step did. */
typedef struct {
    double sumsq;  /* sum of squared (scaled) gradients */
    int nonfinite; /* an inf or NaN gradient: the update was skipped */
    int applied;
    double grad_norm; /* unscaled; inf or NaN when non-finite */
} pxt_adamw_result;

/* Allocator bytes of an AdamW's state for a flat buffer of numel elements in
 * n_tensors tensors, parameters of dtype dt, with or without an EMA. */
size_t pxt_adamw_state_bytes(size_t numel, int n_tensors, pxt_dtype dt, int ema);

/* Reserves the state over f (with an EMA when ema), fills it (moments 0,
 * master and EMA from the parameters) and adds its bytes to f's plans.
 * decay (f->layout.count flags, copied) says which tensors weight decay
 * applies to; NULL: the layout's choice (tensors of 2+ dims).
 * PXT_ERR_* with nothing reserved. */
int pxt_adamw_init(pxt_adamw *o, pxt_flat *f, const pxt_adamw_hparams *h, int ema,
                   const unsigned char *decay);
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
