/* rng.c: xoshiro256** with splitmix64 seeding; Box-Muller normals. */
#include <math.h>

#include "rng.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void pxt_rng_seed(pxt_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) {
        r->s[i] = splitmix64(&seed);
    }
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t pxt_rng_next(pxt_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* uniform in (0, 1]: 53 random bits, never 0 (log(0) below) */
static double uniform(pxt_rng *r) { return ((double)(pxt_rng_next(r) >> 11) + 1.0) * 0x1.0p-53; }

void pxt_rng_normal(pxt_rng *r, float *out, size_t n, float std) {
    const double two_pi = 6.283185307179586476925286766559;
    for (size_t i = 0; i < n; i += 2) {
        double rad = sqrt(-2.0 * log(uniform(r)));
        double ang = two_pi * uniform(r);
        out[i] = (float)(rad * cos(ang) * std);
        if (i + 1 < n) {
            out[i + 1] = (float)(rad * sin(ang) * std);
        }
    }
}

void pxt_rng_uniform(pxt_rng *r, float *out, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        double u = (double)(pxt_rng_next(r) >> 11) * 0x1.0p-53; /* [0, 1) */
        out[i] = (float)(lo + (hi - (double)lo) * u);
    }
}
