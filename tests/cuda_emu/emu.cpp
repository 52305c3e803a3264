/* emu.cpp: the scheduler of emu.h's fibers, its collectives and its memory. */
#include "emu.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>

emu_fiber emu_fib[EMU_MAX_THREADS];
int emu_cur;
emu_dim3 emu_block_idx, emu_grid_dim, emu_block_dim;
alignas(128) unsigned char emu_smem[256 * 1024];
size_t emu_smem_size;
size_t emu_smem_limit;
int emu_late = 1;
long emu_errors, emu_bank_conflicts;

/* Switching: a fiber's first start goes through swapcontext (it needs its own
 * stack); every later switch is _setjmp/_longjmp, which saves no signal mask and
 * so makes no system call (swapcontext makes two per switch). Build without
 * _FORTIFY_SOURCE: its longjmp check refuses jumps between stacks. */
static ucontext_t sched_ctx;
static jmp_buf sched_jb;
static std::function<void()> *body_fn;
static char *stacks[EMU_MAX_THREADS];
#define STACK_BYTES (256 * 1024)

void emu_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (block %u,%u thread %u)\n", emu_block_idx.x, emu_block_idx.y,
            emu_fib[emu_cur].tid.x);
    va_end(ap);
    emu_errors++;
}

void emu_block(int kind) {
    emu_fib[emu_cur].kind = kind;
    if (!_setjmp(emu_fib[emu_cur].jb))
        _longjmp(sched_jb, 1);
}

void emu_do_copy(const emu_copy &c) {
    unsigned char *d = emu_smem + c.dst;
    if (c.bytes)
        memcpy(d, c.src, (size_t)c.bytes);
    memset(d + c.bytes, 0, (size_t)(16 - c.bytes));
}

static void fiber_entry() {
    (*body_fn)();
    emu_fib[emu_cur].kind = K_DONE;
    _longjmp(sched_jb, 1); /* never returns: the stack is reused */
}

/* Runs fiber i until it blocks or ends. */
static void resume(int i) {
    emu_cur = i;
    if (_setjmp(sched_jb))
        return; /* the fiber jumped back */
    emu_fiber &f = emu_fib[i];
    if (!f.started) {
        f.started = 1;
        swapcontext(&sched_ctx, &f.ctx);
    }
    _longjmp(f.jb, 1);
}

static float half_of(uint16_t h, bool bf) { return bf ? pxt_bf16_to_f32(h) : pxt_f16_to_f32(h); }

/* PTX ISA, mma.m16n8k16 .f16/.bf16: groupID = lane >> 2, tig = lane % 4.
 * A: a_i row = groupID for i in {0,1,4,5} else groupID + 8; col = tig*2 + (i & 1) (+8 for i >= 4).
 * B: b_i row = tig*2 + (i & 1) (+8 for i >= 2); col = groupID.
 * C: c_i row = groupID (i < 2) or groupID + 8; col = tig*2 + (i & 1).
 * Pairs: the lower index in the low 16 bits of each 32-bit register. */
static void do_mma(int w, bool bf) {
    double A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        emu_slot &s = emu_fib[32 * w + l].s;
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 8; i++) {
            uint16_t h = (uint16_t)(s.a[i / 2] >> (16 * (i & 1)));
            int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            A[row][t * 2 + (i & 1) + (i >= 4 ? 8 : 0)] = half_of(h, bf);
        }
        for (int i = 0; i < 4; i++) {
            uint16_t h = (uint16_t)((i < 2 ? s.b0 : s.b1) >> (16 * (i & 1)));
            B[t * 2 + (i & 1) + (i >= 2 ? 8 : 0)][g] = half_of(h, bf);
        }
        for (int i = 0; i < 4; i++)
            C[i < 2 ? g : g + 8][t * 2 + (i & 1)] = s.c[i];
    }
    for (int l = 0; l < 32; l++) {
        emu_slot &s = emu_fib[32 * w + l].s;
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) {
            int row = i < 2 ? g : g + 8, col = t * 2 + (i & 1);
            double acc = C[row][col];
            for (int k = 0; k < 16; k++)
                acc += A[row][k] * B[k][col];
            s.rc[i] = (float)acc;
        }
    }
}

/* ldmatrix .m8n8.x4.b16: lanes 8i..8i+7 give the row addresses of matrix i (16-byte
 * rows of 8 elements). Without .trans lane l receives of matrix i the word (row l/4,
 * elements 2(l%4), 2(l%4)+1); with .trans the matrix is read column-major: lane l
 * receives (row 2(l%4), col l/4) low and (row 2(l%4)+1, col l/4) high. */
static void do_ldsm(int w, bool trans) {
    uint32_t addr[32];
    for (int l = 0; l < 32; l++) {
        addr[l] = emu_fib[32 * w + l].s.addr;
        if (addr[l] % 16 || addr[l] + 16 > emu_smem_size) {
            emu_error("ldmatrix: address %u bad (shared size %zu)", addr[l], emu_smem_size);
            return;
        }
    }
    for (int i = 0; i < 4; i++) { /* the 8 rows of one matrix are one 128-byte phase */
        int seen = 0;
        for (int r = 0; r < 8; r++) {
            int bank = (addr[8 * i + r] / 16) % 8;
            if (seen & (1 << bank))
                emu_bank_conflicts++;
            seen |= 1 << bank;
        }
    }
    auto el = [&](int i, int row, int col) {
        uint16_t h;
        memcpy(&h, emu_smem + addr[8 * i + row] + 2 * col, 2);
        return (uint32_t)h;
    };
    for (int l = 0; l < 32; l++) {
        emu_slot &s = emu_fib[32 * w + l].s;
        for (int i = 0; i < 4; i++)
            s.ru[i] = trans ? el(i, 2 * (l % 4), l / 4) | (el(i, 2 * (l % 4) + 1, l / 4) << 16)
                            : el(i, l / 4, 2 * (l % 4)) | (el(i, l / 4, 2 * (l % 4) + 1) << 16);
    }
}

/* Resolves warp w's collective (every lane is at `kind`). */
static void resolve(int w, int kind) {
    switch (kind) {
    case K_SHFL:
        for (int l = 0; l < 32; l++) {
            emu_slot &s = emu_fib[32 * w + l].s;
            s.rword = emu_fib[32 * w + (l ^ s.imm)].s.word;
        }
        break;
    case K_SHFL_IDX: /* lane l gets the word of lane imm */
        for (int l = 0; l < 32; l++) {
            emu_slot &s = emu_fib[32 * w + l].s;
            s.rword = emu_fib[32 * w + s.imm].s.word;
        }
        break;
    case K_BALLOT: {
        uint64_t m = 0;
        for (int l = 0; l < 32; l++)
            m |= (emu_fib[32 * w + l].s.word & 1) << l;
        for (int l = 0; l < 32; l++)
            emu_fib[32 * w + l].s.rword = m;
        break;
    }
    case K_LDSM: do_ldsm(w, false); break;
    case K_LDSMT: do_ldsm(w, true); break;
    case K_MMA_BF: do_mma(w, true); break;
    case K_MMA_H: do_mma(w, false); break;
    }
    for (int l = 0; l < 32; l++)
        emu_fib[32 * w + l].kind = K_RUN;
}

static int is_warp_collective(int k) { return k >= K_SHFL && k <= K_MMA_H; }

static void run_block(int nthreads) {
    memset(emu_smem, 0xff, sizeof emu_smem); /* poison: NaN in every float format */
    for (int i = 0; i < nthreads; i++) {
        if (!stacks[i])
            stacks[i] = (char *)malloc(STACK_BYTES);
        emu_fiber &f = emu_fib[i];
        f.groups.clear();
        f.open.clear();
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = stacks[i];
        f.ctx.uc_stack.ss_size = STACK_BYTES;
        f.ctx.uc_link = &sched_ctx;
        makecontext(&f.ctx, fiber_entry, 0);
        f.started = 0;
        f.kind = K_RUN;
        f.tid.x = (unsigned)i % emu_block_dim.x;
        f.tid.y = (unsigned)i / emu_block_dim.x % emu_block_dim.y;
        f.tid.z = (unsigned)i / (emu_block_dim.x * emu_block_dim.y);
    }
    for (;;) {
        for (int i = 0; i < nthreads; i++)
            if (emu_fib[i].kind == K_RUN)
                resume(i);
        int done = 0, bar = 0;
        for (int i = 0; i < nthreads; i++) {
            done += emu_fib[i].kind == K_DONE;
            bar += emu_fib[i].kind == K_BAR;
        }
        if (done == nthreads)
            return;
        bool resolved = false;
        for (int w = 0; w * 32 < nthreads; w++) {
            int lanes = nthreads - 32 * w < 32 ? nthreads - 32 * w : 32;
            int k = emu_fib[32 * w].kind, at = 0;
            for (int l = 0; l < lanes; l++)
                at += is_warp_collective(emu_fib[32 * w + l].kind);
            if (!at)
                continue;
            if (lanes < 32 || at < lanes) {
                fprintf(stderr, "emu: warp %d of block %u: %d of %d lanes at a warp collective "
                                "(divergence, an exited lane or a partial warp)\n",
                        w, emu_block_idx.x, at, lanes);
                exit(3);
            }
            for (int l = 1; l < 32; l++)
                if (emu_fib[32 * w + l].kind != k) {
                    fprintf(stderr, "emu: warp %d: lanes at different collectives (%d, %d)\n", w, k,
                            emu_fib[32 * w + l].kind);
                    exit(3);
                }
            resolve(w, k);
            resolved = true;
        }
        if (resolved)
            continue;
        if (bar + done == nthreads) {
            if (done)
                emu_error("__syncthreads reached with %d threads exited", done);
            for (int i = 0; i < nthreads; i++)
                if (emu_fib[i].kind == K_BAR)
                    emu_fib[i].kind = K_RUN;
            continue;
        }
        fprintf(stderr, "emu: deadlock in block %u\n", emu_block_idx.x);
        exit(4);
    }
}

void emu_launch(emu_dim3 grid, emu_dim3 block, size_t smem, std::function<void()> body) {
    int nthreads = (int)(block.x * block.y * block.z);
    if (nthreads < 1 || nthreads > EMU_MAX_THREADS || smem > sizeof emu_smem) {
        fprintf(stderr, "emu: bad launch (%d threads, %zu bytes of shared memory)\n", nthreads, smem);
        exit(2);
    }
    if (emu_smem_limit && smem > emu_smem_limit) {
        /* the device refuses it (cudaFuncSetAttribute, then the launch): nothing runs */
        emu_error("launch: %zu bytes of dynamic shared memory per block, over the device's %zu",
                  smem, emu_smem_limit);
        return;
    }
    body_fn = &body;
    emu_grid_dim = grid;
    emu_block_dim = block;
    emu_smem_size = smem;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu_block_idx.x = x, emu_block_idx.y = y, emu_block_idx.z = z;
                run_block(nthreads);
            }
}

/* ---- device memory with a guard page after each allocation ---------------------------- */
struct mapping {
    char *base;
    size_t total, n, slack;
};
static std::map<const void *, mapping> maps;

static void on_segv(int sig) {
    static const char msg[] = "emu: memory access outside a device allocation (SIGSEGV)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(128 + sig);
}

void *emu_alloc(size_t n) {
    static int handler;
    if (!handler) {
        signal(SIGSEGV, on_segv);
        handler = 1;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t data = (n + 255) / 256 * 256; /* the start stays 256-byte aligned */
    size_t pages = (data + page - 1) / page;
    size_t total = (pages + 1) * page;
    char *base = (char *)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        perror("emu: mmap");
        exit(2);
    }
    mprotect(base + pages * page, page, PROT_NONE);
    char *p = base + pages * page - data;
    memset(base, 0xff, pages * page);
    maps[p] = mapping{base, total, n, data - n};
    return p;
}

void emu_free(void *p) {
    auto it = maps.find(p);
    if (it == maps.end())
        return;
    munmap(it->second.base, it->second.total);
    maps.erase(it);
}

int emu_tail_intact(const void *p) {
    auto it = maps.find(p);
    if (it == maps.end())
        return 0;
    const unsigned char *t = (const unsigned char *)p + it->second.n;
    for (size_t i = 0; i < it->second.slack; i++)
        if (t[i] != 0xff)
            return 0;
    return 1;
}
