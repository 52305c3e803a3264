/* graph.cu: CUDA graphs of a step's work (the backend's graph_* entries).
 *
 * While a thread records (graph_begin .. graph_end), pxt_cuda_stream() gives that
 * thread a capture stream of its own, so every entry it calls is recorded there
 * instead of run, and other threads' work on the device is neither recorded nor
 * delayed. The capture stream is non-blocking: a blocking one would tie the record
 * to the legacy default stream, which torch may be using meanwhile. The graph is
 * then launched on the device's stream, in order with the rest of its work.
 *
 * What is recorded must not depend on values that change between replays: the
 * engine passes those through device memory (dropout.h's live keys) and keeps
 * host-dependent work (uploads, the heads' gathers, read-backs) outside. */
#include "cuda_common.h"

thread_local cudaStream_t pxt_cuda_capture[PXT_MAX_DEVICES];

/* The capture streams, one per thread and device, made on first use: two threads
 * may record at once (two models). Never freed: a stream is a few hundred bytes, and
 * a thread that recorded once will likely record again. */
static thread_local cudaStream_t capture_streams[PXT_MAX_DEVICES];

static int capture_stream(int index, cudaStream_t *out) {
    if (!capture_streams[index]) {
        cudaError_t err = cudaStreamCreateWithFlags(&capture_streams[index], cudaStreamNonBlocking);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            capture_streams[index] = NULL;
            return pxt_error(PXT_ERR_DEVICE,
                             "cuda:%d: making a stream to record a graph failed: %s", index,
                             cudaGetErrorString(err));
        }
    }
    *out = capture_streams[index];
    return PXT_OK;
}

extern "C" int pxt_cuda_graph_begin(int index) {
    PXT_CUDA_ENTER(index);
    if (pxt_cuda_capture[index]) {
        return pxt_error(PXT_ERR_VALUE, "cuda:%d: this thread is already recording a graph", index);
    }
    cudaStream_t s = NULL;
    PXT_TRY(capture_stream(index, &s));
    /* the record starts after what the device's stream holds: the uploads
     * queued there are waited for by the launch, which runs on that stream */
    PXT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    pxt_cuda_capture[index] = s;
    return PXT_OK;
}

/* Stops this thread's record on device index (current): the recorded graph, or
 * the error that ended it (cudaErrorStreamCaptureInvalidated after a call that
 * may not be recorded). */
static cudaError_t end_record(int index, cudaGraph_t *g) {
    cudaStream_t s = pxt_cuda_capture[index];
    pxt_cuda_capture[index] = NULL; /* the device's own stream again, whatever follows */
    *g = NULL;
    cudaError_t err = cudaStreamEndCapture(s, g);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        if (*g) {
            (void)cudaGraphDestroy(*g);
            *g = NULL;
        }
    }
    return err;
}

extern "C" int pxt_cuda_graph_end(int index, void **graph) {
    *graph = NULL;
    PXT_CUDA_ENTER(index);
    if (!pxt_cuda_capture[index]) {
        return pxt_error(PXT_ERR_VALUE, "cuda:%d: this thread is not recording a graph", index);
    }
    cudaGraph_t g;
    cudaError_t err = end_record(index, &g);
    if (err != cudaSuccess) {
        return pxt_error(PXT_ERR_DEVICE, "cuda:%d: recording the step as a CUDA graph failed: %s",
                         index, cudaGetErrorString(err));
    }
    cudaGraphExec_t exec = NULL;
    err = cudaGraphInstantiateWithFlags(&exec, g, 0);
    (void)cudaGraphDestroy(g); /* the executable graph is a copy */
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return pxt_error(err == cudaErrorMemoryAllocation ? PXT_ERR_OOM : PXT_ERR_DEVICE,
                         "cuda:%d: instantiating the step's CUDA graph failed: %s", index,
                         cudaGetErrorString(err));
    }
    *graph = (void *)exec;
    return PXT_OK;
}

/* Ends a record the caller abandons because an entry (graph_end's own included) failed
 * while recording; the thread's error message stays that entry's. Nothing to do when no
 * record is open. */
extern "C" void pxt_cuda_graph_abort(int index) {
    if (index < 0 || index >= PXT_MAX_DEVICES || !pxt_cuda_capture[index]) {
        return;
    }
    pxt_cuda_scope scope(index);
    if (scope.rc != PXT_OK) { /* whatever else fails, this thread's work runs again */
        pxt_cuda_capture[index] = NULL;
        return;
    }
    cudaGraph_t g;
    if (end_record(index, &g) == cudaSuccess && g) {
        (void)cudaGraphDestroy(g);
    }
}

extern "C" int pxt_cuda_graph_launch(int index, void *graph) {
    PXT_CUDA_ENTER(index);
    PXT_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, pxt_cuda_stream(index)));
    return PXT_OK;
}

extern "C" void pxt_cuda_graph_free(int index, void *graph) {
    if (!graph) {
        return;
    }
    pxt_cuda_scope scope(index);
    if (scope.rc != PXT_OK || cudaGraphExecDestroy((cudaGraphExec_t)graph) != cudaSuccess) {
        (void)cudaGetLastError(); /* nothing to report to: a leak at worst */
    }
}
