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
 *   output buffer. Exceeding the limit (or the total) returns CUDA_ERROR_OUT_OF_MEMORY. cuMemAlloc_v2, cuMemCreate
 *   (virtual memory management: the physical memory, then cuMemAddressReserve / cuMemMap / cuMemSetAccess make it
 *   addressable) and cuMemAllocAsync (the device's default stream-ordered pool, as cudaMallocAsync) all count
 *   through one path (charge) against the same limit; the device answers 1 for VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
 *   (102) and MEMORY_POOLS_SUPPORTED (115).
 * - NVML: with $GPUFRAC_FAKE_GPU_PROCESSES set, each client writes <dir>/<pid>.json (used memory, SM utilization
 *   while a kernel runs) for the fake NVML to list, and is held to the CUDA 13.4 hard limit the fake NVML set on
 *   its cgroup v2 (/proc/self/cgroup `0::<path>`, limits in <dir>/memory-limits), MPS client or not.
 * - $GPUFRAC_FAKE_CUDA_NEEDS_SHM=<path>: an MPS client fails to connect (CUDA_ERROR_MPS_CONNECTION_FAILED) when
 *   <path> is not visible, as if MPS needed the daemon's /dev/shm.
 * - $GPUFRAC_FAKE_CUDA_REJECT_TARGET=<sm_XY>: cuModuleLoadData refuses PTX for that target (CUDA_ERROR_INVALID_PTX).
 * - $GPUFRAC_FAKE_CUDA_IGNORE_PINNED_LIMIT=1: MPS clients are not held to their pinned limit (a broken MPS).
 * - $GPUFRAC_FAKE_CUDA_UNCOUNTED=vmm,pool: cuMemCreate's (vmm) or the pool's (pool) allocations are not counted
 *   against any limit (a driver whose limits miss them), only against the device's total.
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
typedef unsigned long long CUmemGenericAllocationHandle;

/* cuda.h's layouts, as the check's ctypes Structures give them */
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;                 /* CUmemAllocationType: 1, PINNED */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;   /* type 1 (DEVICE), id: the ordinal */
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; }
        allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_PTX 218
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_MPS_CONNECTION_FAILED 805

#define MIB (1024ULL * 1024ULL)
#define MAX_ALLOCS 4096
#define REAL_MAX MIB
#define GRANULARITY (2 * MIB) /* cuMemGetAllocationGranularity's minimum, as on an H100/H200 */

/* What an entry of `allocs` is: memory cuMemAlloc_v2 gave, a cuMemCreate handle (physical memory, no address), a
 * range cuMemAddressReserve reserved (an address, no memory), mapped to a handle (`handle`, `access` once
 * cuMemSetAccess gave the device read-write), or the pool's. Memory (ALLOC, HANDLE, POOL) is charged; ranges not. */
enum kind { ALLOC, HANDLE, RANGE, POOL };

static int initialized, mps, context_share;
static unsigned long long total_bytes, limit_bytes, used_bytes, next_fake = 0x7f0000000000ULL;
static double rate = 1e8;
static unsigned long long next_handle = 0x1000;
static struct {
    CUdeviceptr ptr; /* HANDLE: the handle */
    unsigned long long size;
    int real, kind, access, counted;
    CUmemGenericAllocationHandle handle; /* RANGE: the handle mapped there, 0: none */
} allocs[MAX_ALLOCS];
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
 * `<its uuid>=<n>M`. 0: none. DROPS_ALL: the value names a GPU the process cannot see (an index above 0, a UUID
 * other than its own), and CUDA drops every pinned limit, the daemon side's included: NVIDIA's measurement on
 * 615.71.09 (Dynamo guide "Per-GPU Compute and Memory Limits with MPS", Verified Behavior: 96,768 MiB allocated
 * under a 10G server limit). */
#define DROPS_ALL (~0ULL)
static unsigned long long env_pinned_mib(const char *value, const char *visible) {
    char buf[1024], *entry, *save = NULL, *eq;
    unsigned long long mine = 0;
    if (!value) return 0;
    snprintf(buf, sizeof buf, "%s", value);
    for (entry = strtok_r(buf, ",", &save); entry; entry = strtok_r(NULL, ",", &save)) {
        if (!(eq = strchr(entry, '='))) return 0;
        *eq = 0;
        if (entry[0] && entry[strspn(entry, "0123456789")] == 0) {
            if (atoi(entry) != 0) return DROPS_ALL;
            mine = strtoull(eq + 1, NULL, 10);
        } else if (visible && !strcmp(entry, visible)) {
            mine = strtoull(eq + 1, NULL, 10);
        } else if (visible) {
            return DROPS_ALL;
        }
    }
    return mine;
}

/* The daemon side's pinned limit (MiB) for this GPU: what the fake MPS daemon was told (<pipe>/fake-server-limits,
 * `<uuid> <MiB>` lines; `*`: every GPU, an MPS v3 namespace's), the line of `visible` where it is known, else the
 * first. 0: none. */
static unsigned long long daemon_pinned_mib(const char *pipe, const char *visible) {
    char path[512], uuid[256];
    unsigned long long mib, found = 0;
    FILE *f;
    snprintf(path, sizeof path, "%s/fake-server-limits", pipe);
    if (!(f = fopen(path, "r"))) return 0;
    while (fscanf(f, "%255s %llu", uuid, &mib) == 2)
        if (!strcmp(uuid, "*") || (visible && !strcmp(uuid, visible)) || (!visible && !found)) found = mib;
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
        mib[1] = mib[0] == DROPS_ALL ? 0 : daemon_pinned_mib(pipe, visible);
        if (mib[0] == DROPS_ALL) mib[0] = 0;
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
    case 102: *value = 1; return CUDA_SUCCESS;  /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    case 115: *value = 1; return CUDA_SUCCESS;  /* MEMORY_POOLS_SUPPORTED */
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
    *free_bytes = (size_t)(used_bytes < limit_bytes ? limit_bytes - used_bytes : 0); /* uncounted kinds may pass it */
    return CUDA_SUCCESS;
}

/* Not counted against the limits ($GPUFRAC_FAKE_CUDA_UNCOUNTED names the kind: vmm or pool). */
static int uncounted(const char *kind) {
    const char *list = getenv("GPUFRAC_FAKE_CUDA_UNCOUNTED");
    char buf[256], *word, *save = NULL;
    if (!list) return 0;
    snprintf(buf, sizeof buf, "%s", list);
    for (word = strtok_r(buf, ",", &save); word; word = strtok_r(NULL, ",", &save))
        if (!strcmp(word, kind)) return 1;
    return 0;
}

/* The one accounting path: `size` bytes of device memory of this kind, at `ptr`, held to the limit (or only to
 * the device's total where the kind is uncounted); small ALLOCs are real host memory, the kernel's output. */
static CUresult charge(int kind, CUdeviceptr ptr, unsigned long long size, int counted) {
    int real = kind == ALLOC && size <= REAL_MAX;
    if (nallocs == MAX_ALLOCS || used_bytes + size > (counted ? limit_bytes : total_bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (real) {
        void *p = calloc(1, size);
        if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
        ptr = (CUdeviceptr)(unsigned long)p;
    }
    allocs[nallocs].ptr = ptr;
    allocs[nallocs].size = size;
    allocs[nallocs].real = real;
    allocs[nallocs].kind = kind;
    allocs[nallocs].access = kind != RANGE;
    allocs[nallocs].counted = counted;
    allocs[nallocs].handle = 0;
    nallocs++;
    if (kind != RANGE) used_bytes += size;
    publish();
    return CUDA_SUCCESS;
}

static CUresult charge_new(int kind, CUdeviceptr *ptr, unsigned long long size, int counted) {
    CUresult r;
    if (!ptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if ((r = charge(kind, next_fake, size, counted)) != CUDA_SUCCESS) return r;
    *ptr = allocs[nallocs - 1].ptr;
    if (!allocs[nallocs - 1].real) next_fake += size;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) { return charge_new(ALLOC, ptr, size, 1); }

static int find_kind(CUdeviceptr ptr, int kind) {
    int i;
    for (i = 0; i < nallocs; i++)
        if (allocs[i].ptr == ptr && allocs[i].kind == kind) return i;
    return -1;
}

static int find(CUdeviceptr ptr) { return find_kind(ptr, ALLOC); }

static CUresult uncharge(int i) {
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    if (allocs[i].real) free((void *)(unsigned long)allocs[i].ptr);
    if (allocs[i].kind != RANGE) used_bytes -= allocs[i].size;
    allocs[i] = allocs[--nallocs];
    publish();
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) { return uncharge(find(ptr)); }

/* The entry whose memory `ptr` .. ptr+count lies in, and may be written through: an allocation, the pool's, or a
 * mapped range the device has access to. -1: none. */
static int find_writable(CUdeviceptr ptr, size_t count) {
    int i;
    for (i = 0; i < nallocs; i++) {
        if (allocs[i].kind == HANDLE || ptr < allocs[i].ptr || ptr + count > allocs[i].ptr + allocs[i].size) continue;
        if (allocs[i].kind == RANGE && (!allocs[i].handle || !allocs[i].access)) return -1;
        return i;
    }
    return -1;
}

CUresult cuMemsetD8_v2(CUdeviceptr ptr, unsigned char value, size_t count) {
    int i = find_writable(ptr, count);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    if (allocs[i].real) memset((void *)(unsigned long)ptr, value, count);
    return CUDA_SUCCESS;
}

/* ---- virtual memory management (cuMemCreate and the ranges it is mapped into) ---- */

static int device_location(const CUmemLocation *where) { return where->type == 1 && where->id == 0; }

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option) {
    if (!granularity || !prop || prop->type != 1 || !device_location(&prop->location) || (option != 0 && option != 1))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    CUresult r;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle || !prop || size == 0 || size % GRANULARITY || flags || prop->type != 1 ||
        !device_location(&prop->location))
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = charge(HANDLE, next_handle, size, !uncounted("vmm"))) != CUDA_SUCCESS) return r;
    *handle = next_handle++;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    int i;
    for (i = 0; i < nallocs; i++) /* still mapped: real CUDA frees it at the unmap; the check unmaps first */
        if (allocs[i].kind == RANGE && allocs[i].handle == handle) return CUDA_ERROR_INVALID_VALUE;
    return uncharge(find_kind(handle, HANDLE));
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (size % GRANULARITY || (alignment && alignment % GRANULARITY) || addr || flags) return CUDA_ERROR_INVALID_VALUE;
    return charge_new(RANGE, ptr, size, 0);
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    int i = find_kind(ptr, RANGE);
    if (i < 0 || allocs[i].size != size || allocs[i].handle) return CUDA_ERROR_INVALID_VALUE;
    return uncharge(i);
}

/* One handle mapped over a whole reserved range (the check maps each chunk into its own range). */
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    int range = find_kind(ptr, RANGE), memory = find_kind(handle, HANDLE);
    if (range < 0 || memory < 0 || offset || flags || allocs[range].handle || allocs[range].size != size ||
        allocs[memory].size != size)
        return CUDA_ERROR_INVALID_VALUE;
    allocs[range].handle = handle;
    allocs[range].access = 0;
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    int range = find_kind(ptr, RANGE);
    if (range < 0 || !allocs[range].handle || allocs[range].size != size || !desc || count != 1 ||
        !device_location(&desc->location) || desc->flags != 3)
        return CUDA_ERROR_INVALID_VALUE;
    allocs[range].access = 1;
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    int range = find_kind(ptr, RANGE);
    if (range < 0 || !allocs[range].handle || allocs[range].size != size) return CUDA_ERROR_INVALID_VALUE;
    allocs[range].handle = 0;
    allocs[range].access = 0;
    return CUDA_SUCCESS;
}

/* ---- the device's default stream-ordered pool (cudaMallocAsync), on the one stream the check uses: 0 ---- */

CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t size, CUstream stream) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (stream) return CUDA_ERROR_INVALID_VALUE;
    return charge_new(POOL, ptr, size, !uncounted("pool"));
}

CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
    if (stream) return CUDA_ERROR_INVALID_VALUE;
    return uncharge(find_kind(ptr, POOL));
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

CUresult cuStreamSynchronize(CUstream stream) { return stream ? CUDA_ERROR_INVALID_VALUE : cuCtxSynchronize(); }

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
    case 801: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case 805: *name = "CUDA_ERROR_MPS_CONNECTION_FAILED"; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
