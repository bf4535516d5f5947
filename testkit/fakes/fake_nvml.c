/*
 * A fake libnvidia-ml.so.1 for gpufrac's tests: the real pynvml loads it through its normal path
 * (dlopen("libnvidia-ml.so.1")), so everything above the C ABI is the real code.
 *
 * State comes from the JSON file named by GPUFRAC_FAKE_NVML, re-read on every call so a test can change it:
 *
 *   {"driver_version": "615.20", "cuda_driver_version": 13040,
 *    "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H200", "memory_total_mib": 143771,
 *              "compute_mode": 0,                             // optional, NVML_COMPUTEMODE_*
 *              "reserved_memory_mib": 600,                    // optional: what the driver keeps (v2 `reserved`)
 *              "processes": [{"pid": 4242, "used_memory_mib": 2048, "sm_util": 35},
 *                            {"pid": 4243, "used_memory_mib": 1024, "mps_server": 4300}],  // an MPS client of 4300
 *              // optional: MPS clients' memory charged to their server, as a driver that does so reports it
 *              // (issue 45; which way a real driver goes is gpucheck's row 6c): the client is listed with its
 *              // usedGpuMemory NVML_VALUE_NOT_AVAILABLE, which pynvml reads as None, and its server with its own
 *              // memory and its clients'. Absent or "client": each client is listed with its own (row 6a's PASS).
 *              "mps_memory": "server",
 *              // what NVIDIA's device plugin and nvidia-ctk ask (optional; absent: NVML_ERROR_NOT_SUPPORTED):
 *              "minor_number": 0,                             // its /dev/nvidia<minor>
 *              "pci_bus_id": "00000000:18:00.0", "pci_device_id": "0x233510de", "pci_subsystem_id": "0x..",
 *              "architecture": "hopper", "brand": "nvidia",   // names of nvmlDeviceArchitecture_t / nvmlBrandType_t
 *              "cuda_compute_capability": "9.0",
 *              "mig_mode": 0, "max_mig_devices": 7,           // MIG off (on: beyond this fake, an error)
 *              "xid_errors": [79]}],                          // critical XIDs, delivered to event sets
 *    "error": 15}                                   // every call fails with that NVML code, or
 *    "error": {"function": "nvmlDeviceGetComputeRunningProcesses_v3", "code": 15}   // only that one
 *
 * With $GPUFRAC_FAKE_GPU_PROCESSES set, the live processes described by <dir>/<pid>.json (written by the fake
 * libcuda.so.1, testkit/fakes/fake_cuda.c: {"pid": .., "used_memory_mib": .., "sm_util": ..}) are GPU 0's too.
 *
 * $GPUFRAC_FAKE_NVML_TRACE=<file>: each call appends its function's name there.
 *
 * A missing file -> NVML_ERROR_DRIVER_NOT_LOADED, an unparsable one -> NVML_ERROR_UNKNOWN; never a crash.
 * Only the calls the gpufrac agent (through pynvml), gpucheck, NVIDIA's k8s-device-plugin v0.18 and
 * nvidia-ctk v1.20 (`cdi generate`, through go-nvml) were found to make are implemented: any other is an undefined
 * symbol (a loud failure, never a made-up answer). What clients set (nvmlDeviceSetComputeMode, the CUDA 13.4
 * memory limits nvmlDeviceSetMemoryLimits_v1 per cgroup) is kept beside the state file, $GPUFRAC_FAKE_NVML.<what>,
 * for every process to read ($GPUFRAC_FAKE_NVML_SETTINGS=<dir>: there instead), and the limits are shared with the fake libcuda.so.1 through
 * $GPUFRAC_FAKE_GPU_PROCESSES/memory-limits. $GPUFRAC_FAKE_NVML_REFUSE_CGROUP_V1=1: a cgroup v1 path (any path on a non-v2 host) is refused
 * as the real driver refuses it (otherwise accepted, as the driver accepts a v2 path: these machines are v1).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/time.h>
#include <time.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define MAX_GPUS 16
#define MAX_PROCS 64
#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL /* nvml.h: a value the driver cannot tell */
#define MAX_FILE (256 * 1024)

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct { const char *nameSpace; unsigned long long softLimit, hardLimit; } nvmlSetMemoryLimits_v1_t;
typedef struct {
    const char *nameSpace;
    unsigned long long softLimit, hardLimit, currentUsed;
} nvmlGetMemoryLimits_v1_t;

typedef struct { unsigned int index; } fake_device; /* what an nvmlDevice_t points at */

typedef struct { unsigned int pid; long long used_mib; int sm_util; unsigned int mps_server; } fake_proc;
#define MAX_XIDS 16
typedef struct {
    char uuid[96], name[96];
    long long memory_total_mib;
    long long reserved_mib;
    int compute_mode;
    int mps_memory_on_server; /* "mps_memory": "server" */
    int nprocs;
    fake_proc procs[MAX_PROCS];
    /* What NVIDIA's device plugin and container toolkit ask (absent from the file: -1 / empty, and the call
     * answers NVML_ERROR_NOT_SUPPORTED, as a driver does for what a board lacks). */
    int minor_number;
    char pci_bus_id[32];
    long long pci_device_id, pci_subsystem_id;
    int architecture, brand, mig_mode, max_mig_devices;
    int cc_major, cc_minor;
    int nxids;
    unsigned long long xids[MAX_XIDS];
} fake_gpu;
typedef struct {
    char driver_version[80];
    int cuda_driver_version;
    int error_code;            /* 0: none */
    char error_function[128];  /* empty: every function */
    int ngpus;
    fake_gpu gpus[MAX_GPUS];
} fake_state;

static fake_device devices[MAX_GPUS];
/* As NVML's: each nvmlInit counts, and the library stays initialized until as many nvmlShutdown calls (a
 * client's goroutines init and shut down on their own, as NVIDIA's device plugin's health check does). */
static int initialized;
/* Clients call from several threads: the state file's buffer, the init count and the event sets are shared. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- a small JSON reader: just enough for the schema above, strict about syntax ---- */

typedef struct { const char *p, *end; int ok; } reader;

static void skip_ws(reader *r) {
    while (r->p < r->end && isspace((unsigned char)*r->p)) r->p++;
}

static int expect(reader *r, char c) {
    skip_ws(r);
    if (r->p < r->end && *r->p == c) { r->p++; return 1; }
    r->ok = 0;
    return 0;
}

static int peek(reader *r, char c) {
    skip_ws(r);
    return r->p < r->end && *r->p == c;
}

/* Reads a string into out (truncated to cap-1; escapes kept simple: \" \\ \/ and letters copied). */
static void read_string(reader *r, char *out, size_t cap) {
    size_t n = 0;
    if (!expect(r, '"')) return;
    while (r->p < r->end && *r->p != '"') {
        char c = *r->p++;
        if (c == '\\') {
            if (r->p >= r->end) { r->ok = 0; return; }
            c = *r->p++;
            if (c == 'u') { /* skip 4 hex digits, store '?' */
                if (r->end - r->p < 4) { r->ok = 0; return; }
                r->p += 4;
                c = '?';
            } else if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
        }
        if (out && n + 1 < cap) out[n++] = c;
    }
    if (out && cap) out[n] = '\0';
    if (!expect(r, '"')) return;
}

static double read_number(reader *r) {
    char *stop;
    double v;
    skip_ws(r);
    if (r->p >= r->end) { r->ok = 0; return 0; }
    v = strtod(r->p, &stop);
    if (stop == r->p || stop > r->end) { r->ok = 0; return 0; }
    r->p = stop;
    return v;
}

static void skip_value(reader *r, int depth);

static void skip_literal(reader *r, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) >= n && strncmp(r->p, word, n) == 0) r->p += n;
    else r->ok = 0;
}

static void skip_value(reader *r, int depth) {
    skip_ws(r);
    if (depth > 32 || r->p >= r->end) { r->ok = 0; return; }
    switch (*r->p) {
    case '"': read_string(r, NULL, 0); return;
    case '{':
        r->p++;
        if (peek(r, '}')) { r->p++; return; }
        while (r->ok) {
            read_string(r, NULL, 0);
            expect(r, ':');
            skip_value(r, depth + 1);
            if (peek(r, ',')) { r->p++; continue; }
            expect(r, '}');
            return;
        }
        return;
    case '[':
        r->p++;
        if (peek(r, ']')) { r->p++; return; }
        while (r->ok) {
            skip_value(r, depth + 1);
            if (peek(r, ',')) { r->p++; continue; }
            expect(r, ']');
            return;
        }
        return;
    case 't': skip_literal(r, "true"); return;
    case 'f': skip_literal(r, "false"); return;
    case 'n': skip_literal(r, "null"); return;
    default: read_number(r); return;
    }
}

/* Iterates the members of an object: call with *first=1; returns 1 with the key read, 0 at the end. */
static int next_member(reader *r, int *first, char *key, size_t cap) {
    if (!r->ok) return 0;
    if (*first) {
        *first = 0;
        if (!expect(r, '{')) return 0;
        if (peek(r, '}')) { r->p++; return 0; }
    } else {
        if (peek(r, ',')) r->p++;
        else { expect(r, '}'); return 0; }
    }
    read_string(r, key, cap);
    expect(r, ':');
    return r->ok;
}

/* Same for arrays: returns 1 when positioned at the next element. */
static int next_element(reader *r, int *first) {
    if (!r->ok) return 0;
    if (*first) {
        *first = 0;
        if (!expect(r, '[')) return 0;
        if (peek(r, ']')) { r->p++; return 0; }
        return 1;
    }
    if (peek(r, ',')) { r->p++; return 1; }
    expect(r, ']');
    return 0;
}

static void read_process(reader *r, fake_proc *proc) {
    char key[64];
    int first = 1;
    proc->sm_util = -1;
    while (next_member(r, &first, key, sizeof key)) {
        if (!strcmp(key, "pid")) proc->pid = (unsigned int)read_number(r);
        else if (!strcmp(key, "used_memory_mib")) proc->used_mib = (long long)read_number(r);
        else if (!strcmp(key, "sm_util")) proc->sm_util = (int)read_number(r);
        else if (!strcmp(key, "mps_server")) proc->mps_server = (unsigned int)read_number(r);
        else skip_value(r, 1);
    }
}

/* Names the file may use for an architecture or a brand, and their NVML values (nvmlDeviceArchitecture_t,
 * nvmlBrandType_t). */
typedef struct { const char *name; int value; } named_value;
static const named_value ARCHITECTURES[] = {
    {"kepler", 2}, {"maxwell", 3}, {"pascal", 4}, {"volta", 5}, {"turing", 6}, {"ampere", 7}, {"ada", 8},
    {"hopper", 9}, {"blackwell", 10}, {"rubin", 13}, {NULL, 0}};
static const named_value BRANDS[] = {
    {"unknown", 0}, {"quadro", 1}, {"tesla", 2}, {"nvs", 3}, {"geforce", 5}, {"titan", 6},
    {"nvidia_rtx", 13}, {"nvidia", 14}, {NULL, 0}};

static int read_named(reader *r, const named_value *table) {
    char word[32];
    int i;
    read_string(r, word, sizeof word);
    for (i = 0; r->ok && table[i].name; i++)
        if (!strcmp(word, table[i].name)) return table[i].value;
    r->ok = 0;  /* a name the fake does not know makes the file unparsable: never a silent default */
    return -1;
}

/* "9.0" -> 9, 0 */
static void read_compute_capability(reader *r, fake_gpu *gpu) {
    char text[16];
    read_string(r, text, sizeof text);
    if (r->ok && sscanf(text, "%d.%d", &gpu->cc_major, &gpu->cc_minor) != 2) r->ok = 0;
}

/* "0x233510de" (JSON has no hex numbers) */
static long long read_hex(reader *r) {
    char text[24], *stop;
    unsigned long long v;
    read_string(r, text, sizeof text);
    if (!r->ok) return -1;
    v = strtoull(text, &stop, 16);
    if (stop == text || *stop || v > 0xFFFFFFFFULL) { r->ok = 0; return -1; }
    return (long long)v;
}

static void read_xids(reader *r, fake_gpu *gpu) {
    int first = 1;
    while (next_element(r, &first)) {
        if (gpu->nxids >= MAX_XIDS) { r->ok = 0; return; }
        gpu->xids[gpu->nxids++] = (unsigned long long)read_number(r);
    }
}

static void read_gpu(reader *r, fake_gpu *gpu) {
    char key[64];
    int first = 1;
    gpu->minor_number = gpu->architecture = gpu->brand = gpu->mig_mode = gpu->max_mig_devices = -1;
    gpu->cc_major = gpu->cc_minor = -1;
    gpu->pci_device_id = gpu->pci_subsystem_id = -1;
    while (next_member(r, &first, key, sizeof key)) {
        if (!strcmp(key, "uuid")) read_string(r, gpu->uuid, sizeof gpu->uuid);
        else if (!strcmp(key, "name")) read_string(r, gpu->name, sizeof gpu->name);
        else if (!strcmp(key, "memory_total_mib")) gpu->memory_total_mib = (long long)read_number(r);
        else if (!strcmp(key, "compute_mode")) gpu->compute_mode = (int)read_number(r);
        else if (!strcmp(key, "reserved_memory_mib")) gpu->reserved_mib = (long long)read_number(r);
        else if (!strcmp(key, "mps_memory")) {
            char where[16];
            read_string(r, where, sizeof where);
            gpu->mps_memory_on_server = !strcmp(where, "server");
        } else if (!strcmp(key, "minor_number")) gpu->minor_number = (int)read_number(r);
        else if (!strcmp(key, "pci_bus_id")) read_string(r, gpu->pci_bus_id, sizeof gpu->pci_bus_id);
        else if (!strcmp(key, "pci_device_id")) gpu->pci_device_id = read_hex(r);
        else if (!strcmp(key, "pci_subsystem_id")) gpu->pci_subsystem_id = read_hex(r);
        else if (!strcmp(key, "architecture")) gpu->architecture = read_named(r, ARCHITECTURES);
        else if (!strcmp(key, "brand")) gpu->brand = read_named(r, BRANDS);
        else if (!strcmp(key, "cuda_compute_capability")) read_compute_capability(r, gpu);
        else if (!strcmp(key, "mig_mode")) gpu->mig_mode = (int)read_number(r);
        else if (!strcmp(key, "max_mig_devices")) gpu->max_mig_devices = (int)read_number(r);
        else if (!strcmp(key, "xid_errors")) read_xids(r, gpu);
        else if (!strcmp(key, "processes")) {
            int efirst = 1;
            while (next_element(r, &efirst)) {
                if (gpu->nprocs >= MAX_PROCS) { r->ok = 0; return; }
                read_process(r, &gpu->procs[gpu->nprocs++]);
            }
        } else skip_value(r, 1);
    }
}

static void read_error(reader *r, fake_state *st) {
    char key[64];
    int first = 1;
    if (!peek(r, '{')) { st->error_code = (int)read_number(r); return; }
    while (next_member(r, &first, key, sizeof key)) {
        if (!strcmp(key, "function")) read_string(r, st->error_function, sizeof st->error_function);
        else if (!strcmp(key, "code")) st->error_code = (int)read_number(r);
        else skip_value(r, 1);
    }
}

/* GPU 0's processes from the fake libcuda's files (see the top): live PIDs only. */
static void read_process_dir(fake_state *st) {
    static char buf[4096];
    const char *dir = getenv("GPUFRAC_FAKE_GPU_PROCESSES");
    char path[1024];
    struct dirent *entry;
    DIR *d;
    if (!dir || !*dir || st->ngpus == 0 || !(d = opendir(dir))) return;
    while ((entry = readdir(d))) {
        size_t n = strlen(entry->d_name);
        fake_proc proc;
        reader r;
        FILE *f;
        if (entry->d_name[0] == '.' || n < 6 || strcmp(entry->d_name + n - 5, ".json")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
        if (!(f = fopen(path, "rb"))) continue;
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        r.p = buf; r.end = buf + n; r.ok = 1;
        memset(&proc, 0, sizeof proc);
        read_process(&r, &proc);
        if (!r.ok || proc.pid == 0 || (kill((pid_t)proc.pid, 0) != 0 && errno == ESRCH)) continue;
        if (st->gpus[0].nprocs < MAX_PROCS) st->gpus[0].procs[st->gpus[0].nprocs++] = proc;
    }
    closedir(d);
}

/* Loads the state file; returns an NVML code. */
static int load_state_locked(fake_state *st) {
    static char buf[MAX_FILE];
    const char *path = getenv("GPUFRAC_FAKE_NVML");
    FILE *f;
    size_t n;
    reader r;
    char key[64];
    int first = 1;

    memset(st, 0, sizeof *st);
    if (!path || !*path) return NVML_ERROR_DRIVER_NOT_LOADED;
    f = fopen(path, "rb");
    if (!f) return NVML_ERROR_DRIVER_NOT_LOADED;
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (n == sizeof buf) return NVML_ERROR_UNKNOWN;
    r.p = buf; r.end = buf + n; r.ok = 1;
    while (next_member(&r, &first, key, sizeof key)) {
        if (!strcmp(key, "driver_version")) read_string(&r, st->driver_version, sizeof st->driver_version);
        else if (!strcmp(key, "cuda_driver_version")) st->cuda_driver_version = (int)read_number(&r);
        else if (!strcmp(key, "error")) read_error(&r, st);
        else if (!strcmp(key, "gpus")) {
            int efirst = 1;
            while (next_element(&r, &efirst)) {
                if (st->ngpus >= MAX_GPUS) { r.ok = 0; break; }
                read_gpu(&r, &st->gpus[st->ngpus++]);
            }
        } else skip_value(&r, 0);
    }
    skip_ws(&r);
    if (!r.ok || r.p != r.end) return NVML_ERROR_UNKNOWN;
    read_process_dir(st);
    return NVML_SUCCESS;
}

static int load_state(fake_state *st) {
    int rc;
    pthread_mutex_lock(&lock);
    rc = load_state_locked(st);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* $GPUFRAC_FAKE_NVML_TRACE names a file that gets one line per call (the function's name): what a client of
 * the fake (NVIDIA's device plugin, nvidia-ctk) asked. */
static void trace(const char *function) {
    const char *path = getenv("GPUFRAC_FAKE_NVML_TRACE");
    FILE *f;
    if (!path || !*path || !(f = fopen(path, "a"))) return;
    fprintf(f, "%s\n", function);
    fclose(f);
}

/* Every entry point starts here: load the state, apply injected errors, check initialization. */
static int enter(fake_state *st, const char *function, int needs_init) {
    int rc;
    trace(function);
    rc = load_state(st);
    if (rc != NVML_SUCCESS) return rc;
    if (st->error_code && (!st->error_function[0] || !strcmp(st->error_function, function)))
        return st->error_code;
    if (needs_init) {
        pthread_mutex_lock(&lock);
        rc = initialized > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
        pthread_mutex_unlock(&lock);
    }
    return rc;
}

static fake_gpu *gpu_of(fake_state *st, const fake_device *device) {
    if (!device || device < devices || device >= devices + MAX_GPUS) return NULL;
    if ((int)device->index >= st->ngpus) return NULL;
    return &st->gpus[device->index];
}

static int copy_out(char *out, unsigned int length, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

static const unsigned long long MIB = 1024ULL * 1024ULL;

/* ---- the NVML ABI ---- */

int nvmlInitWithFlags(unsigned int flags) {
    fake_state st;
    int rc = enter(&st, "nvmlInitWithFlags", 0);
    (void)flags;
    if (rc != NVML_SUCCESS) return rc;
    pthread_mutex_lock(&lock);
    initialized++;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlInit(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    int rc = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (initialized > 0) initialized--;
    else rc = NVML_ERROR_UNINITIALIZED;
    pthread_mutex_unlock(&lock);
    return rc;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 17: return "Operating System error";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    fake_state st;
    int rc = enter(&st, "nvmlSystemGetDriverVersion", 1);
    return rc ? rc : copy_out(version, length, st.driver_version);
}

static int cuda_version(const char *function, int *out) {
    fake_state st;
    int rc = enter(&st, function, 1);
    if (rc) return rc;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    *out = st.cuda_driver_version;
    return NVML_SUCCESS;
}

int nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version("nvmlSystemGetCudaDriverVersion", v); }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version("nvmlSystemGetCudaDriverVersion_v2", v); }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    fake_state st;
    int rc = enter(&st, "nvmlDeviceGetCount_v2", 1);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)st.ngpus;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, fake_device **device) {
    fake_state st;
    int rc = enter(&st, "nvmlDeviceGetHandleByIndex_v2", 1);
    if (rc) return rc;
    if (!device || index >= (unsigned int)st.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    devices[index].index = index;
    *device = &devices[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetIndex(fake_device *device, unsigned int *index) {
    fake_state st;
    int rc = enter(&st, "nvmlDeviceGetIndex", 1);
    if (rc) return rc;
    if (!gpu_of(&st, device) || !index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(fake_device *device, char *uuid, unsigned int length) {
    fake_state st;
    fake_gpu *gpu;
    int rc = enter(&st, "nvmlDeviceGetUUID", 1);
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device))) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_out(uuid, length, gpu->uuid);
}

int nvmlDeviceGetName(fake_device *device, char *name, unsigned int length) {
    fake_state st;
    fake_gpu *gpu;
    int rc = enter(&st, "nvmlDeviceGetName", 1);
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device))) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_out(name, length, gpu->name);
}

static unsigned long long used_bytes(const fake_gpu *gpu) {
    unsigned long long used = 0;
    int i;
    for (i = 0; i < gpu->nprocs; i++) used += (unsigned long long)gpu->procs[i].used_mib * MIB;
    return used;
}

/* As the real NVML: v1's `used` is the sum of reserved and allocated memory; v2 reports `reserved` apart, and
 * `used` is what is allocated; in both, free = total - reserved - allocated. */
int nvmlDeviceGetMemoryInfo(fake_device *device, nvmlMemory_t *memory) {
    fake_state st;
    fake_gpu *gpu;
    unsigned long long taken;
    int rc = enter(&st, "nvmlDeviceGetMemoryInfo", 1);
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device)) || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = (unsigned long long)gpu->memory_total_mib * MIB;
    taken = (unsigned long long)gpu->reserved_mib * MIB + used_bytes(gpu);
    memory->used = taken;
    memory->free = memory->total > taken ? memory->total - taken : 0;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(fake_device *device, nvmlMemory_v2_t *memory) {
    fake_state st;
    fake_gpu *gpu;
    unsigned long long taken;
    int rc = enter(&st, "nvmlDeviceGetMemoryInfo_v2", 1);
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device)) || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != 0x02000028) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = (unsigned long long)gpu->memory_total_mib * MIB;
    memory->reserved = (unsigned long long)gpu->reserved_mib * MIB;
    memory->used = used_bytes(gpu);
    taken = memory->reserved + memory->used;
    memory->free = memory->total > taken ? memory->total - taken : 0;
    return NVML_SUCCESS;
}

/* A process' usedGpuMemory: its own, or where the GPU charges MPS clients to their server ("mps_memory": "server"),
 * NVML_VALUE_NOT_AVAILABLE for a client and its own plus its clients' for a server. The GPU's used memory is the
 * same either way. Source: none of NVIDIA's documents says which way the driver reports an MPS client's memory
 * (../shared/reference/nvidia-stack.md has no such measurement); this mode is the hypothesis, off by
 * default, and only lets the agent be tested against it. gpucheck row 6c measures the real driver. */
static unsigned long long reported_usage(const fake_gpu *gpu, int i) {
    unsigned long long used = (unsigned long long)gpu->procs[i].used_mib * MIB;
    int j;
    if (!gpu->mps_memory_on_server) return used;
    if (gpu->procs[i].mps_server) return NVML_VALUE_NOT_AVAILABLE;
    for (j = 0; j < gpu->nprocs; j++)
        if (gpu->procs[j].mps_server == gpu->procs[i].pid) used += (unsigned long long)gpu->procs[j].used_mib * MIB;
    return used;
}

int nvmlDeviceGetComputeRunningProcesses_v3(fake_device *device, unsigned int *count,
                                            nvmlProcessInfo_v2_t *infos) {
    fake_state st;
    fake_gpu *gpu;
    int i, rc = enter(&st, "nvmlDeviceGetComputeRunningProcesses_v3", 1);
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device)) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (*count < (unsigned int)gpu->nprocs || (!infos && gpu->nprocs)) {
        *count = (unsigned int)gpu->nprocs;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i = 0; i < gpu->nprocs; i++) {
        infos[i].pid = gpu->procs[i].pid;
        infos[i].usedGpuMemory = reported_usage(gpu, i);
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = (unsigned int)gpu->nprocs;
    return NVML_SUCCESS;
}

int nvmlDeviceGetProcessUtilization(fake_device *device, nvmlProcessUtilizationSample_t *samples,
                                    unsigned int *count, unsigned long long last_seen) {
    fake_state st;
    fake_gpu *gpu;
    struct timeval tv;
    unsigned long long now;
    unsigned int n = 0, i;
    int rc = enter(&st, "nvmlDeviceGetProcessUtilization", 1);
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device)) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    gettimeofday(&tv, NULL);
    now = (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
    for (i = 0; i < (unsigned int)gpu->nprocs; i++)
        if (gpu->procs[i].sm_util >= 0) n++;
    if (n == 0 || last_seen >= now) return NVML_ERROR_NOT_FOUND;
    if (!samples || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    n = 0;
    for (i = 0; i < (unsigned int)gpu->nprocs; i++) {
        if (gpu->procs[i].sm_util < 0) continue;
        samples[n].pid = gpu->procs[i].pid;
        samples[n].timeStamp = now;
        samples[n].smUtil = (unsigned int)gpu->procs[i].sm_util;
        samples[n].memUtil = samples[n].encUtil = samples[n].decUtil = 0;
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

/* Settings that outlive the process that made them, as the driver keeps them: files beside the state file
 * ($GPUFRAC_FAKE_NVML.<what>), one line per setting, the last line for a key wins. The state file itself is the
 * test's (it rewrites it whole), so what NVML clients set is kept apart from it. */
static FILE *side_file(const char *what, const char *how) {
    const char *state = getenv("GPUFRAC_FAKE_NVML"), *dir = getenv("GPUFRAC_FAKE_NVML_SETTINGS"), *base;
    char path[1024];
    if (!state || !*state) return NULL;
    if (dir && *dir) { /* a directory of their own (a test whose state file is shared, read-only) */
        base = strrchr(state, '/');
        snprintf(path, sizeof path, "%s/%s.%s", dir, base ? base + 1 : state, what);
    } else {
        snprintf(path, sizeof path, "%s.%s", state, what);
    }
    return fopen(path, how);
}

/* nvmlDeviceGetComputeMode: what nvmlDeviceSetComputeMode last set on that GPU, else the state file's. */
int nvmlDeviceGetComputeMode(fake_device *device, int *mode) {
    fake_state st;
    fake_gpu *gpu;
    char line[256], uuid[96];
    int set, rc = enter(&st, "nvmlDeviceGetComputeMode", 1);
    FILE *f;
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device)) || !mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = gpu->compute_mode;
    if ((f = side_file("compute-modes", "r"))) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "%95s %d", uuid, &set) == 2 && !strcmp(uuid, gpu->uuid)) *mode = set;
        fclose(f);
    }
    return NVML_SUCCESS;
}

/* nvmlDeviceSetComputeMode (NVML API reference: NVML_COMPUTEMODE_DEFAULT 0, EXCLUSIVE_PROCESS 3; 1 is retired,
 * 2 PROHIBITED). NVIDIA's MPS documentation recommends EXCLUSIVE_PROCESS under an MPS server: the server then holds
 * the GPU's one context, and a process that does not go through MPS gets none (the fake MPS client reads it). */
int nvmlDeviceSetComputeMode(fake_device *device, int mode) {
    fake_state st;
    fake_gpu *gpu;
    int rc = enter(&st, "nvmlDeviceSetComputeMode", 1);
    FILE *f;
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device)) || mode < 0 || mode > 3 || mode == 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (!(f = side_file("compute-modes", "a"))) return NVML_ERROR_UNKNOWN;
    fprintf(f, "%s %d\n", gpu->uuid, mode);
    fclose(f);
    return NVML_SUCCESS;
}

#define NVML_ERROR_NOT_SUPPORTED 3

/* Whether a cgroup path is a cgroup v1 hierarchy's (/sys/fs/cgroup/<controller>/...): the driver's dmem limit
 * lives on cgroup v2 only (`dmem.max`/`dmem.min`, kernel 6.14+). This fake ACCEPTS a v1 path as the real driver
 * accepts a v2 one (the test machines are cgroup v1), unless $GPUFRAC_FAKE_NVML_REFUSE_CGROUP_V1=1, where it
 * answers NVML_ERROR_NOT_SUPPORTED as the real driver does on v1: for a v1 path, and for any path on a host whose
 * /sys/fs/cgroup is not cgroup v2 (a hybrid host's `0::` path too). */
static int cgroup_v1_path(const char *path) {
    static const char *controllers[] = {"memory/", "cpu/", "cpuacct/", "cpu,cpuacct/", "cpuset/", "devices/",
                                        "freezer/", "blkio/", "pids/", "hugetlb/", "perf_event/", "net_cls/",
                                        "net_cls,net_prio/", "rdma/", "systemd/", "misc/", NULL};
    const char *rest = "/sys/fs/cgroup/";
    if (strncmp(path, rest, strlen(rest))) return 0;
    for (int i = 0; controllers[i]; i++)
        if (!strncmp(path + strlen(rest), controllers[i], strlen(controllers[i]))) return 1;
    return 0;
}

/* nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1 (CUDA 13.4, r615+; what the toolkit's
 * apply-cuda-memory-limits hook calls at creation): soft and hard limits per (GPU, cgroup path), kept in
 * $GPUFRAC_FAKE_NVML.memory-limits as `<uuid> <hard> <soft> <path>` lines so every process sees them (the agent
 * sets, a test reads back). Unset reads as 0 / MAX, like NVML. A driver before r615 answers NOT_SUPPORTED. */
/* Whether /sys/fs/cgroup is a cgroup v2 mount (statfs's CGROUP2_SUPER_MAGIC): on a v1 or hybrid host the unified
 * entry of /proc/<pid>/cgroup (`0::<path>`) names no dmem controller either, so the real driver holds no limit
 * whatever the path looks like. Source: NVIDIA's MPS v3 memory partitioning (r615) maps limits to dmem.max/dmem.min,
 * and dmem needs cgroup v2 (kernel 6.14+ for the dmem controller): ../shared/reference/nvidia-stack.md, "MPS limits". */
static int host_is_cgroup_v2(void) {
    struct statfs fs;
    return statfs("/sys/fs/cgroup", &fs) == 0 && fs.f_type == 0x63677270;
}

static int limits_supported(const fake_state *st, const char *path) {
    if (atoi(st->driver_version) < 615) return 0;
    const char *refuse = getenv("GPUFRAC_FAKE_NVML_REFUSE_CGROUP_V1");
    if (refuse && !strcmp(refuse, "1") && (cgroup_v1_path(path) || !host_is_cgroup_v2()))
        return 0;
    return 1;
}

/* For the fake libcuda.so.1: "<hard> <soft> <cgroup path>" lines in $GPUFRAC_FAKE_GPU_PROCESSES/memory-limits
 * (the last line of a path wins), so its clients are held to their cgroup's limit as the driver would. */
static void share_limit(const nvmlSetMemoryLimits_v1_t *set) {
    const char *dir = getenv("GPUFRAC_FAKE_GPU_PROCESSES");
    char path[1024];
    FILE *f;
    if (!dir || !*dir) return;
    snprintf(path, sizeof path, "%s/memory-limits", dir);
    if (!(f = fopen(path, "a"))) return;
    fprintf(f, "%llu %llu %s\n", set->hardLimit, set->softLimit, set->nameSpace);
    fclose(f);
}

int nvmlDeviceSetMemoryLimits_v1(fake_device *device, nvmlSetMemoryLimits_v1_t *set) {
    fake_state st;
    fake_gpu *gpu;
    int rc = enter(&st, "nvmlDeviceSetMemoryLimits_v1", 1);
    FILE *f;
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device)) || !set || !set->nameSpace || set->nameSpace[0] != '/' ||
        strlen(set->nameSpace) >= 900 || strchr(set->nameSpace, ' ') || strchr(set->nameSpace, '\n'))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!limits_supported(&st, set->nameSpace)) return NVML_ERROR_NOT_SUPPORTED;
    if (!(f = side_file("memory-limits", "a"))) return NVML_ERROR_UNKNOWN;
    fprintf(f, "%s %llu %llu %s\n", gpu->uuid, set->hardLimit, set->softLimit, set->nameSpace);
    fclose(f);
    share_limit(set);
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryLimits_v1(fake_device *device, nvmlGetMemoryLimits_v1_t *get) {
    fake_state st;
    fake_gpu *gpu;
    char line[1200], uuid[96], where[1000];
    unsigned long long hard, soft;
    int rc = enter(&st, "nvmlDeviceGetMemoryLimits_v1", 1);
    FILE *f;
    if (rc) return rc;
    if (!(gpu = gpu_of(&st, device)) || !get || !get->nameSpace) return NVML_ERROR_INVALID_ARGUMENT;
    if (!limits_supported(&st, get->nameSpace)) return NVML_ERROR_NOT_SUPPORTED;
    get->softLimit = 0;
    get->hardLimit = ~0ULL;
    get->currentUsed = 0;
    if ((f = side_file("memory-limits", "r"))) {
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "%95s %llu %llu %999s", uuid, &hard, &soft, where) == 4 && !strcmp(uuid, gpu->uuid) &&
                !strcmp(where, get->nameSpace)) {
                get->softLimit = soft;
                get->hardLimit = hard;
            }
        fclose(f);
    }
    return NVML_SUCCESS;
}

/* ---- what NVIDIA's container toolkit (`nvidia-ctk cdi generate`) and k8s-device-plugin call, through go-nvml and
 * go-nvlib; each answers from the GPU's entry in the state file ---- */

#define NVML_ERROR_TIMEOUT 10

/* The GPU of a handle, with the usual entry checks; *gpu is NULL when rc is not NVML_SUCCESS. */
static int device_entry(fake_state *st, const char *function, fake_device *device, fake_gpu **gpu) {
    int rc = enter(st, function, 1);
    *gpu = NULL;
    if (rc) return rc;
    if (!(*gpu = gpu_of(st, device))) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static int handle_of(int index, fake_device **device) {
    devices[index].index = (unsigned int)index;
    *device = &devices[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, fake_device **device) {
    fake_state st;
    int i, rc = enter(&st, "nvmlDeviceGetHandleByUUID", 1);
    if (rc) return rc;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < st.ngpus; i++)
        if (!strcmp(st.gpus[i].uuid, uuid)) return handle_of(i, device);
    return NVML_ERROR_NOT_FOUND;
}

int nvmlDeviceGetMinorNumber(fake_device *device, unsigned int *minor) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetMinorNumber", device, &gpu);
    if (rc) return rc;
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu->minor_number < 0) return NVML_ERROR_NOT_SUPPORTED;
    *minor = (unsigned int)gpu->minor_number;
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

int nvmlDeviceGetPciInfo_v3(fake_device *device, nvmlPciInfo_t *pci) {
    fake_state st;
    fake_gpu *gpu;
    unsigned int domain, bus, slot, function;
    int rc = device_entry(&st, "nvmlDeviceGetPciInfo_v3", device, &gpu);
    if (rc) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->pci_bus_id[0] || gpu->pci_device_id < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (sscanf(gpu->pci_bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4) return NVML_ERROR_UNKNOWN;
    memset(pci, 0, sizeof *pci);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = slot;
    pci->pciDeviceId = (unsigned int)gpu->pci_device_id;
    pci->pciSubSystemId = gpu->pci_subsystem_id < 0 ? 0 : (unsigned int)gpu->pci_subsystem_id;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xFFFF, bus, slot, function);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", domain, bus, slot, function);
    return NVML_SUCCESS;
}

int nvmlDeviceGetArchitecture(fake_device *device, unsigned int *arch) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetArchitecture", device, &gpu);
    if (rc) return rc;
    if (!arch) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu->architecture < 0) return NVML_ERROR_NOT_SUPPORTED;
    *arch = (unsigned int)gpu->architecture;
    return NVML_SUCCESS;
}

int nvmlDeviceGetCudaComputeCapability(fake_device *device, int *major, int *minor) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetCudaComputeCapability", device, &gpu);
    if (rc) return rc;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu->cc_major < 0) return NVML_ERROR_NOT_SUPPORTED;
    *major = gpu->cc_major;
    *minor = gpu->cc_minor;
    return NVML_SUCCESS;
}

int nvmlDeviceGetBrand(fake_device *device, int *brand) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetBrand", device, &gpu);
    if (rc) return rc;
    if (!brand) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu->brand < 0) return NVML_ERROR_NOT_SUPPORTED;
    *brand = gpu->brand;
    return NVML_SUCCESS;
}

/* Topology and NVLink, which NVIDIA's device plugin asks (go-gpuallocator) to prefer close GPUs on every whole-GPU
 * allocation. The state file describes no PCIe topology and no NVLink: two GPUs are answered as the farthest level
 * NVML has (NVML_TOPOLOGY_SYSTEM, across CPUs: no preference between pairs), a GPU with itself as
 * NVML_TOPOLOGY_INTERNAL, and NVLink as NOT_SUPPORTED (a board without NVLink), which the allocator skips. */
#define NVML_TOPOLOGY_INTERNAL 0
#define NVML_TOPOLOGY_SYSTEM 50
int nvmlDeviceGetTopologyCommonAncestor(fake_device *first, fake_device *second, int *level) {
    fake_state st;
    fake_gpu *a, *b;
    int rc = device_entry(&st, "nvmlDeviceGetTopologyCommonAncestor", first, &a);
    if (rc) return rc;
    if (!(b = gpu_of(&st, second)) || !level) return NVML_ERROR_INVALID_ARGUMENT;
    *level = a == b ? NVML_TOPOLOGY_INTERNAL : NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

int nvmlDeviceGetNvLinkState(fake_device *device, unsigned int link, int *active) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetNvLinkState", device, &gpu);
    (void)link;
    if (rc) return rc;
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(fake_device *device, unsigned int link, void *pci) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetNvLinkRemotePciInfo_v2", device, &gpu);
    (void)link;
    if (rc) return rc;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

/* MIG: the file says whether it is on (1) or off (0); the fake has no MIG devices, so it can only be off or
 * absent (a board without MIG: NOT_SUPPORTED, as NVML answers for one). */
int nvmlDeviceGetMigMode(fake_device *device, unsigned int *current, unsigned int *pending) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetMigMode", device, &gpu);
    if (rc) return rc;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (gpu->mig_mode != 0) return NVML_ERROR_UNKNOWN;  /* MIG devices are beyond this fake: say so loudly */
    *current = *pending = 0;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(fake_device *device, unsigned int *count) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetMaxMigDeviceCount", device, &gpu);
    if (rc) return rc;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu->max_mig_devices < 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = (unsigned int)gpu->max_mig_devices;
    return NVML_SUCCESS;
}

/* With MIG off there is no MIG device at any index (NVML: NOT_FOUND below the maximum). */
int nvmlDeviceGetMigDeviceHandleByIndex(fake_device *device, unsigned int index, fake_device **mig) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetMigDeviceHandleByIndex", device, &gpu);
    if (rc) return rc;
    if (!mig || gpu->max_mig_devices < 0 || index >= (unsigned int)gpu->max_mig_devices)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_FOUND;
}

/* Event sets: the fake delivers critical XID errors, those the state file lists under a GPU's "xid_errors" (a test
 * appends one with FakeGpuState.xid_error); a set sees those appended after it registered for that GPU. */
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL
#define MAX_EVENT_SETS 16

typedef struct {
    int used;
    unsigned long long mask[MAX_GPUS];
    int delivered[MAX_GPUS];
} fake_event_set;
static fake_event_set event_sets[MAX_EVENT_SETS];

typedef struct {
    fake_device *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static int valid_set(const fake_event_set *set) {
    return set && set >= event_sets && set < event_sets + MAX_EVENT_SETS && set->used;
}

int nvmlEventSetCreate(fake_event_set **set) {
    fake_state st;
    int i, rc = enter(&st, "nvmlEventSetCreate", 1);
    if (rc) return rc;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    for (i = 0; i < MAX_EVENT_SETS && event_sets[i].used; i++) {}
    if (i < MAX_EVENT_SETS) {
        memset(&event_sets[i], 0, sizeof event_sets[i]);
        event_sets[i].used = 1;
        *set = &event_sets[i];
    }
    pthread_mutex_unlock(&lock);
    return i < MAX_EVENT_SETS ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

int nvmlEventSetFree(fake_event_set *set) {
    fake_state st;
    int rc = enter(&st, "nvmlEventSetFree", 1);
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    rc = valid_set(set) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) set->used = 0;
    pthread_mutex_unlock(&lock);
    return rc;
}

int nvmlDeviceGetSupportedEventTypes(fake_device *device, unsigned long long *types) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceGetSupportedEventTypes", device, &gpu);
    if (rc) return rc;
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    return NVML_SUCCESS;
}

int nvmlDeviceRegisterEvents(fake_device *device, unsigned long long types, fake_event_set *set) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceRegisterEvents", device, &gpu);
    if (rc) return rc;
    if (types & ~NVML_EVENT_TYPE_XID_CRITICAL_ERROR) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    rc = valid_set(set) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        set->mask[device->index] |= types;
        set->delivered[device->index] = gpu->nxids;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* The next XID error the set has not seen, into *data; 0 when there is none. */
static int next_event(fake_state *st, fake_event_set *set, nvmlEventData_t *data) {
    int i, found = 0;
    pthread_mutex_lock(&lock);
    for (i = 0; i < st->ngpus && !found; i++) {
        if (!(set->mask[i] & NVML_EVENT_TYPE_XID_CRITICAL_ERROR) || set->delivered[i] >= st->gpus[i].nxids)
            continue;
        devices[i].index = (unsigned int)i;
        data->device = &devices[i];
        data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
        data->eventData = st->gpus[i].xids[set->delivered[i]++];
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
        found = 1;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

/* Waits up to timeout_ms for an event, re-reading the state file every 50 ms: NVML_ERROR_TIMEOUT when none came. */
int nvmlEventSetWait_v2(fake_event_set *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    fake_state st;
    unsigned int waited = 0;
    const struct timespec step = {0, 50 * 1000 * 1000};
    int rc = enter(&st, "nvmlEventSetWait_v2", 1);
    if (rc) return rc;
    if (!valid_set(set) || !data) return NVML_ERROR_INVALID_ARGUMENT;
    for (;;) {
        if (next_event(&st, set, data)) return NVML_SUCCESS;
        if (waited >= timeout_ms) return NVML_ERROR_TIMEOUT;
        nanosleep(&step, NULL);
        waited += 50;
        if ((rc = load_state(&st)) != NVML_SUCCESS) return rc;
    }
}

/* Every handle of this fake is a whole GPU (no MIG devices). */
int nvmlDeviceIsMigDeviceHandle(fake_device *device, unsigned int *is_mig) {
    fake_state st;
    fake_gpu *gpu;
    int rc = device_entry(&st, "nvmlDeviceIsMigDeviceHandle", device, &gpu);
    if (rc) return rc;
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = 0;
    return NVML_SUCCESS;
}
