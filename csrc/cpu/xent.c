/* xent.c: fused softmax cross-entropy (forward and, in place, backward) and the
 * deterministic sum that turns per-token losses into a loss.
 *
 * The softmax never materialises: per row, the max, then sum(exp(x - max)) in
 * double, then loss = (max - x[t]) + log(sum) (in double: x[t] close to the
 * log-sum-exp would cancel in float), then with backward the row is
 * overwritten by scale * (exp(x - max) / sum - onehot(t)). Rows are independent,
 * so any thread count gives the same bits. A logit is x plus the bias where one
 * is given: the heads add their bias here rather than in a pass of its own. */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "elem.h"

int pxt_cpu_softmax_xent(int index, float *logits, int ld, const float *bias, float *losses,
                         const int32_t *targets, int N, int V, float scale, int backward) {
    (void)index;
    if (N < 0 || V <= 0 || ld < V) {
        return pxt_error(PXT_ERR_VALUE, "softmax_xent: bad size N=%d V=%d (rows %d apart)", N, V,
                         ld);
    }
    /* O(N) and before any write: a bad target would read outside its row */
    int rc = pxt_cpu_check_ids(targets, N, -1, V, "softmax_xent (targets)");
    if (rc != PXT_OK) {
        return rc;
    }
    /* logits (N, V) fp32, rows ld apart, overwritten by dlogits (and zeros in
     * columns V..ld-1) with backward; bias (V) or NULL; losses (N); targets (N).
     * A logit is x[j] + bias[j], one fp32 add as add_bias makes it. */
#pragma omp parallel for schedule(static) if ((size_t)N * V >= PXT_OMP_MIN_WORK)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * ld; /* (ld) */
        int t = targets[i];
        if (backward && ld > V) {
            memset(x + V, 0, (size_t)(ld - V) * sizeof(float));
        }
        if (t < 0) { /* ignored: no loss, no gradient */
            losses[i] = 0.0f;
            if (backward) {
                memset(x, 0, (size_t)V * sizeof(float));
            }
            continue;
        }
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) {
            float l = bias ? x[j] + bias[j] : x[j];
            mx = l > mx ? l : mx;
        }
        double sum = 0.0;
        for (int j = 0; j < V; j++) {
            sum += expf((bias ? x[j] + bias[j] : x[j]) - mx);
        }
        float lt = bias ? x[t] + bias[t] : x[t];
        losses[i] = (float)(((double)mx - lt) + log(sum));
        if (backward) {
            float inv = (float)(1.0 / sum);
            for (int j = 0; j < V; j++) {
                float l = bias ? x[j] + bias[j] : x[j];
                x[j] = scale * (expf(l - mx) * inv - (j == t ? 1.0f : 0.0f));
            }
        }
    }
    return PXT_OK;
}

/* Fixed partition of x into SUM_PARTS contiguous parts (whatever the thread
 * count), each summed in double with 4 interleaved accumulators, then the parts
 * added in order: the bits depend on n alone. */
#define SUM_PARTS 256

int pxt_cpu_sum(int index, double *out, const float *x, size_t n) {
    (void)index;
    double part[SUM_PARTS]; /* (SUM_PARTS) */
    size_t len = (n + SUM_PARTS - 1) / SUM_PARTS;
#pragma omp parallel for schedule(static) if (n >= PXT_OMP_MIN_WORK)
    for (int p = 0; p < SUM_PARTS; p++) {
        size_t lo = (size_t)p * len < n ? (size_t)p * len : n;
        size_t hi = n - lo < len ? n : lo + len;
        double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
        size_t i = lo;
        for (; i + 4 <= hi; i += 4) {
            a0 += x[i];
            a1 += x[i + 1];
            a2 += x[i + 2];
            a3 += x[i + 3];
        }
        for (; i < hi; i++) {
            a0 += x[i];
        }
        part[p] = (a0 + a1) + (a2 + a3);
    }
    double total = 0.0;
    for (int p = 0; p < SUM_PARTS; p++) {
        total += part[p];
    }
    *out = total;
    return PXT_OK;
}

#undef SUM_PARTS
