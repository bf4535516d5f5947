/*
 * A fake libcuda.so.1 for gpucheck/gpu_check.py's tests: the driver API calls its clients make, with the real
 * signatures (cuda.h, _v2 symbols), so the check's ctypes code runs unchanged. One fake GPU, device 0.
 *
 * - MPS: a client whose $CUDA_MPS_PIPE_DIRECTORY holds a `control` socket is an MPS client; the fake MPS daemon
 *   writes `fake-context-share` (true/false) there. Its memory limit is the lower of the daemon side's (the fake
 *   daemon's `fake-server-limits`) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT's (`0=<n>M` or `<uuid>=<n>M`).
 * - Kernels: gpufrac_spin runs `iterations / GPUFRAC_FAKE_CUDA_RATE` seconds (default 1e8 per second). Without MPS,
 *   or through a server without context sharing, kernels of different processes take turns (a lock file shared
 *   by every process: $GPUFRAC_FAKE_CUDA_LOCK, default /tmp/gpufrac-fake-cuda.lock); with sm-sharing they overlap.
 * - Memory: allocations over 1 MiB are bookkeeping only (no host memory); small ones are real, for the kernel's
 *   output buffer. Exceeding the limit (or the total) returns CUDA_ERROR_OUT_OF_MEMORY.
 * - NVML: with $GPUFRAC_FAKE_GPU_PROCESSES set, each client writes <dir>/<pid>.json (used memory, SM utilization
 *   while a kernel runs) for the fake NVML to list, and is held to the CUDA 13.4 hard limit the fake NVML set on
 *   its cgroup v2 (/proc/self/cgroup `0::<path>`, limits in <dir>/memory-limits), MPS client or not.
 * - $GPUFRAC_FAKE_CUDA_NEEDS_SHM=<path>: an MPS client fails to connect (CUDA_ERROR_MPS_CONNECTION_FAILED) when
 *   <path> is not visible, as if MPS needed the daemon's /dev/shm.
 * - $GPUFRAC_FAKE_CUDA_REJECT_TARGET=<sm_XY>: cuModuleLoadData refuses PTX for that target (CUDA_ERROR_INVALID_PTX).
 * - $GPUFRAC_FAKE_CUDA_IGNORE_PINNED_LIMIT=1: MPS clients are not held to their pinned limit (a broken MPS).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_PTX 218
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_MPS_CONNECTION_FAILED 805

#define MIB (1024ULL * 1024ULL)
#define MAX_ALLOCS 4096
#define REAL_MAX MIB

static int initialized, mps, context_share;
static unsigned long long total_bytes, limit_bytes, used_bytes, next_fake = 0x7f0000000000ULL;
static double rate = 1e8;
static struct { CUdeviceptr ptr; unsigned long long size; int real; } allocs[MAX_ALLOCS];
static int nallocs;
static int pending, running_util;
static unsigned long long pending_iterations;
static CUdeviceptr pending_out;
static double pending_launch;
static int context_token, module_token, function_token;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void publish(void) {
    const char *dir = getenv("GPUFRAC_FAKE_GPU_PROCESSES");
    char path[512], tmp[512];
    FILE *f;
    if (!dir || !*dir) return;
    snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
    snprintf(tmp, sizeof tmp, "%s/.%d.tmp", dir, (int)getpid());
    if (!(f = fopen(tmp, "w"))) return;
    fprintf(f, "{\"pid\": %d, \"used_memory_mib\": %llu, \"sm_util\": %d}\n", (int)getpid(), used_bytes / MIB,
            running_util);
    fclose(f);
    rename(tmp, path);
}

static void unpublish(void) {
    const char *dir = getenv("GPUFRAC_FAKE_GPU_PROCESSES");
    char path[512];
    if (!dir || !*dir) return;
    snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
    unlink(path);
}

static int file_is(const char *dir, const char *name, int socket_wanted) {
    char path[512];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (stat(path, &st) != 0) return 0;
    return socket_wanted ? S_ISSOCK(st.st_mode) : 1;
}

static int read_context_share(const char *dir) {
    char path[512], buf[16] = {0};
    FILE *f;
    snprintf(path, sizeof path, "%s/fake-context-share", dir);
    if (!(f = fopen(path, "r"))) return 1; /* legacy MPS: clients share the server's context */
    if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
    fclose(f);
    return strncmp(buf, "false", 5) != 0;
}

/* The pinned limit (MiB) a client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT gives this fake's one device, as CUDA reads it
 * for a process that sees one GPU (named by `visible`, its UUID, where CUDA_VISIBLE_DEVICES says so): `0=<n>M` or
 * `<its uuid>=<n>M`; an index it cannot see (above 0) drops the whole value, as NVIDIA measured on r615. 0: none. */
static unsigned long long env_pinned_mib(const char *value, const char *visible) {
    char buf[1024], *entry, *save = NULL, *eq;
    unsigned long long mine = 0;
    if (!value) return 0;
    snprintf(buf, sizeof buf, "%s", value);
    for (entry = strtok_r(buf, ",", &save); entry; entry = strtok_r(NULL, ",", &save)) {
        if (!(eq = strchr(entry, '='))) return 0;
        *eq = 0;
        if (entry[0] && entry[strspn(entry, "0123456789")] == 0) {
            if (atoi(entry) != 0) return 0;
            mine = strtoull(eq + 1, NULL, 10);
        } else if (visible && !strcmp(entry, visible)) {
            mine = strtoull(eq + 1, NULL, 10);
        }
    }
    return mine;
}

/* The daemon side's pinned limit (MiB) for this GPU: what the fake MPS daemon was told (<pipe>/fake-server-limits,
 * `<uuid> <MiB>` lines), the line of `visible` where it is known, else the first. 0: none. */
static unsigned long long daemon_pinned_mib(const char *pipe, const char *visible) {
    char path[512], uuid[256];
    unsigned long long mib, found = 0;
    FILE *f;
    snprintf(path, sizeof path, "%s/fake-server-limits", pipe);
    if (!(f = fopen(path, "r"))) return 0;
    while (fscanf(f, "%255s %llu", uuid, &mib) == 2)
        if ((visible && !strcmp(uuid, visible)) || (!visible && !found)) found = mib;
    fclose(f);
    return found;
}

/* The hard limit set (through the fake NVML) on this process's cgroup v2, or 0 when there is none. */
static unsigned long long cgroup_limit(void) {
    const char *dir = getenv("GPUFRAC_FAKE_GPU_PROCESSES");
    char line[1024], mine[1100] = "", path[1024];
    unsigned long long hard, soft, found = 0;
    FILE *f;
    if (!dir || !*dir || !(f = fopen("/proc/self/cgroup", "r"))) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(mine, sizeof mine, "/sys/fs/cgroup%.1000s", line + 3);
        }
    fclose(f);
    snprintf(path, sizeof path, "%s/memory-limits", dir);
    if (!mine[0] || !(f = fopen(path, "r"))) return 0;
    while (fgets(line, sizeof line, f)) {
        char where[1100];
        if (sscanf(line, "%llu %llu %1099s", &hard, &soft, where) == 3 && !strcmp(where, mine)) found = hard;
    }
    fclose(f);
    return found;
}

CUresult cuInit(unsigned int flags) {
    const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY"), *v;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    total_bytes = (unsigned long long)((v = getenv("GPUFRAC_FAKE_CUDA_TOTAL_MIB")) ? atoll(v) : 143771) * MIB;
    if ((v = getenv("GPUFRAC_FAKE_CUDA_RATE"))) rate = atof(v);
    limit_bytes = total_bytes;
    if (cgroup_limit() && cgroup_limit() < limit_bytes) limit_bytes = cgroup_limit();
    mps = pipe && file_is(pipe, "control", 1);
    if (mps) {
        context_share = read_context_share(pipe);
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        unsigned long long mib[2];
        if (visible && strncmp(visible, "GPU-", 4)) visible = NULL;
        mib[0] = env_pinned_mib(getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), visible);
        mib[1] = daemon_pinned_mib(pipe, visible);
        for (int i = 0; i < 2 && !getenv("GPUFRAC_FAKE_CUDA_IGNORE_PINNED_LIMIT"); i++)
            if (mib[i] && mib[i] * MIB < limit_bytes) limit_bytes = mib[i] * MIB; /* the env only lowers */
    }
    initialized = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 13040;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!name || len < 24) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "NVIDIA H200 (fake CUDA)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attribute) {
    case 16: *value = 132; return CUDA_SUCCESS; /* MULTIPROCESSOR_COUNT */
    case 75: *value = 9; return CUDA_SUCCESS;   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = 0; return CUDA_SUCCESS;   /* COMPUTE_CAPABILITY_MINOR */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)total_bytes;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    const char *shm = getenv("GPUFRAC_FAKE_CUDA_NEEDS_SHM");
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (mps && shm && *shm && access(shm, F_OK) != 0) return CUDA_ERROR_MPS_CONNECTION_FAILED;
    *ctx = &context_token;
    publish();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    unpublish();
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx == &context_token ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    *total = (size_t)limit_bytes;
    *free_bytes = (size_t)(limit_bytes - used_bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    int real = size <= REAL_MAX;
    if (!ptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (used_bytes + size > limit_bytes || nallocs == MAX_ALLOCS) return CUDA_ERROR_OUT_OF_MEMORY;
    if (real) {
        void *p = calloc(1, size);
        if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
        *ptr = (CUdeviceptr)(unsigned long)p;
    } else {
        *ptr = next_fake;
        next_fake += size;
    }
    allocs[nallocs].ptr = *ptr;
    allocs[nallocs].size = size;
    allocs[nallocs].real = real;
    nallocs++;
    used_bytes += size;
    publish();
    return CUDA_SUCCESS;
}

static int find(CUdeviceptr ptr) {
    int i;
    for (i = 0; i < nallocs; i++)
        if (allocs[i].ptr == ptr) return i;
    return -1;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
    int i = find(ptr);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    if (allocs[i].real) free((void *)(unsigned long)ptr);
    used_bytes -= allocs[i].size;
    allocs[i] = allocs[--nallocs];
    publish();
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr ptr, unsigned char value, size_t count) {
    int i = find(ptr);
    if (i < 0 || count > allocs[i].size) return CUDA_ERROR_INVALID_VALUE;
    if (allocs[i].real) memset((void *)(unsigned long)ptr, value, count);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t count) {
    int i = find(src);
    if (!dst || i < 0 || !allocs[i].real || count > allocs[i].size) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (void *)(unsigned long)src, count);
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    const char *ptx = image, *reject = getenv("GPUFRAC_FAKE_CUDA_REJECT_TARGET");
    char target[32];
    const char *t;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!module || !ptx) return CUDA_ERROR_INVALID_VALUE;
    if (!strstr(ptx, ".version ") || !strstr(ptx, ".address_size 64") || !strstr(ptx, ".entry gpufrac_spin(") ||
        !(t = strstr(ptx, ".target ")))
        return CUDA_ERROR_INVALID_PTX;
    if (sscanf(t, ".target %31s", target) != 1) return CUDA_ERROR_INVALID_PTX;
    if (reject && !strcmp(reject, target)) return CUDA_ERROR_INVALID_PTX;
    *module = &module_token;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    if (!function || module != &module_token || !name) return CUDA_ERROR_INVALID_VALUE;
    if (strcmp(name, "gpufrac_spin") != 0) return CUDA_ERROR_NOT_FOUND;
    *function = &function_token;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra) {
    int i;
    if (f != &function_token || !params || extra || gx == 0 || bx == 0 || gy != 1 || gz != 1 || by != 1 ||
        bz != 1 || shared != 0 || stream)
        return CUDA_ERROR_INVALID_VALUE;
    pending_out = *(CUdeviceptr *)params[0];
    pending_iterations = *(unsigned long long *)params[1];
    i = find(pending_out);
    if (i < 0 || !allocs[i].real || allocs[i].size < 16 + 4ULL * gx * bx) return CUDA_ERROR_INVALID_VALUE;
    pending = 1;
    pending_launch = now();
    running_util = 95;
    publish();
    return CUDA_SUCCESS;
}

static void sleep_until(double when) {
    double left;
    while ((left = when - now()) > 0) {
        struct timespec ts = {(time_t)left, (long)((left - (time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

CUresult cuCtxSynchronize(void) {
    double start, seconds;
    int lock = -1;
    unsigned long long *out;
    if (!pending) return CUDA_SUCCESS;
    seconds = pending_iterations / rate;
    if (!mps || !context_share) { /* take turns with every other process's kernels */
        const char *path = getenv("GPUFRAC_FAKE_CUDA_LOCK");
        lock = open(path && *path ? path : "/tmp/gpufrac-fake-cuda.lock", O_CREAT | O_RDWR, 0666);
        if (lock >= 0) flock(lock, LOCK_EX);
        start = now();
    } else {
        start = pending_launch;
    }
    sleep_until(start + seconds);
    if (lock >= 0) close(lock);
    out = (unsigned long long *)(unsigned long)pending_out;
    out[0] = (unsigned long long)(start * 1e9);
    out[1] = (unsigned long long)((start + seconds) * 1e9);
    pending = 0;
    running_util = 0;
    publish();
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case 0: *name = "CUDA_SUCCESS"; break;
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case 3: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case 218: *name = "CUDA_ERROR_INVALID_PTX"; break;
    case 500: *name = "CUDA_ERROR_NOT_FOUND"; break;
    case 805: *name = "CUDA_ERROR_MPS_CONNECTION_FAILED"; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
