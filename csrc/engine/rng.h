/* rng.h: the host random stream of parameter initialisation (xoshiro256**,
 * seeded through splitmix64). Same seed, same parameters, on any machine. */
#ifndef PXT_RNG_H
#define PXT_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} pxt_rng;

void pxt_rng_seed(pxt_rng *r, uint64_t seed);
uint64_t pxt_rng_next(pxt_rng *r);
/* n samples of N(0, std^2) (Box-Muller in double, rounded to float). */
void pxt_rng_normal(pxt_rng *r, float *out, size_t n, float std);
/* n samples of U(lo, hi) (53 random bits each, rounded to float). */
void pxt_rng_uniform(pxt_rng *r, float *out, size_t n, float lo, float hi);

#endif
