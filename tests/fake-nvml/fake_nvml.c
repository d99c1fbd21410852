/*
 * A fake libnvidia-ml.so.1 for oomguard's tests: there is no GPU on the
 * machines that run them, yet the real nvml-wrapper code path must run.
 *
 * It exports the NVML symbols nvml-wrapper 0.13 calls for oomguard's GPU
 * probe, with the struct layouts of the NVML 12/13 headers, and answers from
 * a scenario file that is re-read on every call, so a test can change the
 * answers while the probe runs.
 *
 * Scenario file location: $FAKE_NVML_SCENARIO if set, otherwise the file
 * named `scenario` in the directory this library was loaded from (found with
 * dladdr). The second form lets each test copy the library into its own
 * directory and need no environment variable at all. A missing file is an
 * empty scenario: init succeeds, zero devices.
 *
 * Format: one `key=value` per line; blank lines and `#` comments ignored.
 *   driver_version=550.54.15
 *   init_error=9                         nvmlInit_v2 / nvmlInitWithFlags return 9
 *   gpu=0 total=N reserved=N used=N [util=N] [grow=N] [uuid=S] [name=rest of line]
 *        `name=` must come last (it takes the rest of the line); without
 *        `util=` utilisation is NOT_SUPPORTED; without `uuid=` the UUID call
 *        is NOT_SUPPORTED; `grow=N` adds N bytes to `used` on each
 *        nvmlDeviceGetMemoryInfo_v2 call for that device (counted in the
 *        library, so per loaded copy); free = total - reserved - used.
 *   proc=0 pid=N used=N|na               a compute process on device 0
 *   fail=SYMBOL [code=N] [after=N] [gpu=I]
 *        SYMBOL returns N (default 999, UNKNOWN) once it has been called more
 *        than `after` times (default 0: at once), only for device I if given
 *   sleep=SYMBOL ms=N [gpu=I]            SYMBOL sleeps N ms before answering
 *   bogus_count=0                         device 0 reports 0xFFFFFFFF compute
 *                                         processes (a driver-bug stand-in)
 *
 * Compile-time variants leave a symbol out, as an old or broken driver would:
 * -DFAKE_NVML_NO_SHUTDOWN (nvmlShutdown), -DFAKE_NVML_NO_UUID
 * (nvmlDeviceGetUUID), -DFAKE_NVML_NO_INIT (nvmlInit_v2).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* Layouts from nvml.h (natural alignment, as the Rust bindings declare). */
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* Opaque device handles: addresses inside this array. */
#define MAX_GPUS 8
struct fake_device { int index; };
static struct fake_device handles[MAX_GPUS];
typedef struct fake_device *nvmlDevice_t;

/* ---- scenario ----------------------------------------------------------- */

#define MAX_PROCS 64
#define MAX_RULES 16
#define SYM_LEN 64

struct gpu {
    int present;
    unsigned long long total, reserved, used, grow;
    int has_util;
    unsigned int util;
    int has_uuid;
    char uuid[96];
    char name[96];
    int bogus_count;
    int nprocs;
    unsigned int pids[MAX_PROCS];
    unsigned long long proc_used[MAX_PROCS];
};

struct rule {
    char symbol[SYM_LEN];
    int code;          /* fail rules */
    long after;        /* fail rules */
    long ms;           /* sleep rules */
    int gpu;           /* -1: any device */
};

struct scenario {
    int init_error;
    char driver_version[80];
    int ngpus; /* highest gpu index + 1 */
    struct gpu gpus[MAX_GPUS];
    int nfail, nsleep;
    struct rule fails[MAX_RULES], sleeps[MAX_RULES];
};

static void scenario_path(char *out, size_t len)
{
    const char *env = getenv("FAKE_NVML_SCENARIO");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return;
    }
    Dl_info info;
    if (dladdr((void *)&scenario_path, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            snprintf(out, len, "%.*s/scenario", (int)(slash - info.dli_fname), info.dli_fname);
            return;
        }
    }
    snprintf(out, len, "scenario");
}

/* Value of ` key=` inside an attribute list, or NULL. */
static const char *attr(const char *list, const char *key)
{
    size_t klen = strlen(key);
    for (const char *p = list; (p = strstr(p, key)) != NULL; p += klen) {
        if ((p == list || p[-1] == ' ') && p[klen] == '=')
            return p + klen + 1;
    }
    return NULL;
}

static unsigned long long attr_u64(const char *list, const char *key, unsigned long long dflt)
{
    const char *v = attr(list, key);
    return v ? strtoull(v, NULL, 10) : dflt;
}

/* Copy the word at `v` (up to a space or the end). */
static void word(char *out, size_t len, const char *v)
{
    size_t n = strcspn(v, " ");
    if (n >= len)
        n = len - 1;
    memcpy(out, v, n);
    out[n] = '\0';
}

static void parse_rule(struct rule *r, const char *value)
{
    word(r->symbol, sizeof r->symbol, value);
    r->code = (int)attr_u64(value, "code", NVML_ERROR_UNKNOWN);
    r->after = (long)attr_u64(value, "after", 0);
    r->ms = (long)attr_u64(value, "ms", 0);
    const char *g = attr(value, "gpu");
    r->gpu = g ? atoi(g) : -1;
}

static void load(struct scenario *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->driver_version, sizeof s->driver_version, "550.54.15");
    char path[PATH_MAX];
    scenario_path(path, sizeof path);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *eq = strchr(line, '=');
        if (line[0] == '#' || !eq)
            continue;
        *eq = '\0';
        const char *key = line, *value = eq + 1;
        if (!strcmp(key, "init_error")) {
            s->init_error = atoi(value);
        } else if (!strcmp(key, "driver_version")) {
            snprintf(s->driver_version, sizeof s->driver_version, "%s", value);
        } else if (!strcmp(key, "gpu")) {
            int i = atoi(value);
            if (i < 0 || i >= MAX_GPUS)
                continue;
            struct gpu *g = &s->gpus[i];
            g->present = 1;
            g->total = attr_u64(value, "total", 0);
            g->reserved = attr_u64(value, "reserved", 0);
            g->used = attr_u64(value, "used", 0);
            g->grow = attr_u64(value, "grow", 0);
            g->has_util = attr(value, "util") != NULL;
            g->util = (unsigned int)attr_u64(value, "util", 0);
            const char *u = attr(value, "uuid");
            g->has_uuid = u != NULL;
            if (u)
                word(g->uuid, sizeof g->uuid, u);
            const char *n = attr(value, "name");
            snprintf(g->name, sizeof g->name, "%s", n ? n : "Fake GPU");
            if (i + 1 > s->ngpus)
                s->ngpus = i + 1;
        } else if (!strcmp(key, "proc")) {
            int i = atoi(value);
            if (i < 0 || i >= MAX_GPUS || s->gpus[i].nprocs >= MAX_PROCS)
                continue;
            struct gpu *g = &s->gpus[i];
            const char *used = attr(value, "used");
            g->pids[g->nprocs] = (unsigned int)attr_u64(value, "pid", 0);
            g->proc_used[g->nprocs] =
                (!used || !strncmp(used, "na", 2)) ? ~0ULL : strtoull(used, NULL, 10);
            g->nprocs++;
        } else if (!strcmp(key, "bogus_count")) {
            int i = atoi(value);
            if (i >= 0 && i < MAX_GPUS)
                s->gpus[i].bogus_count = 1;
        } else if (!strcmp(key, "fail") && s->nfail < MAX_RULES) {
            parse_rule(&s->fails[s->nfail++], value);
        } else if (!strcmp(key, "sleep") && s->nsleep < MAX_RULES) {
            parse_rule(&s->sleeps[s->nsleep++], value);
        }
    }
    fclose(f);
}

/* ---- per-library state (one copy per loaded file) ------------------------ */

static int init_count;
static unsigned long long memory_calls[MAX_GPUS];

/* Calls per symbol name, for `fail=... after=N`. */
#define MAX_COUNTERS 32
static struct { char symbol[SYM_LEN]; long calls; } counters[MAX_COUNTERS];

static long count_call(const char *symbol)
{
    for (int i = 0; i < MAX_COUNTERS; i++) {
        if (!counters[i].symbol[0])
            snprintf(counters[i].symbol, SYM_LEN, "%s", symbol);
        if (!strcmp(counters[i].symbol, symbol))
            return __atomic_add_fetch(&counters[i].calls, 1, __ATOMIC_SEQ_CST);
    }
    return 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* Common prologue of every exported call: load the scenario, apply `sleep`
 * and `fail` rules. Returns NVML_SUCCESS to go on, or the error to return. */
static nvmlReturn_t enter(struct scenario *s, const char *symbol, int gpu)
{
    load(s);
    long calls = count_call(symbol);
    for (int i = 0; i < s->nsleep; i++) {
        struct rule *r = &s->sleeps[i];
        if (!strcmp(r->symbol, symbol) && (r->gpu < 0 || r->gpu == gpu))
            sleep_ms(r->ms);
    }
    for (int i = 0; i < s->nfail; i++) {
        struct rule *r = &s->fails[i];
        if (!strcmp(r->symbol, symbol) && (r->gpu < 0 || r->gpu == gpu) && calls > r->after)
            return r->code;
    }
    return NVML_SUCCESS;
}

/* Device index of a handle, or -1 when it is not one of ours / not in the scenario. */
static int device_index(const struct scenario *s, nvmlDevice_t device)
{
    if (device < &handles[0] || device >= &handles[MAX_GPUS])
        return -1;
    int i = (int)(device - &handles[0]);
    return (i < s->ngpus && s->gpus[i].present) ? i : -1;
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ---- exported NVML API --------------------------------------------------- */

static nvmlReturn_t do_init(const char *symbol)
{
    struct scenario s;
    nvmlReturn_t rc = enter(&s, symbol, -1);
    if (rc)
        return rc;
    if (s.init_error)
        return s.init_error;
    __atomic_add_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_NO_INIT
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
#endif

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init("nvmlInitWithFlags");
}

#ifndef FAKE_NVML_NO_SHUTDOWN
EXPORT nvmlReturn_t nvmlShutdown(void)
{
    struct scenario s;
    nvmlReturn_t rc = enter(&s, "nvmlShutdown", -1);
    if (rc)
        return rc;
    if (__atomic_load_n(&init_count, __ATOMIC_SEQ_CST) <= 0)
        return NVML_ERROR_UNINITIALIZED;
    __atomic_sub_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}
#endif

#define REQUIRE_INIT()                                                  \
    do {                                                                \
        if (__atomic_load_n(&init_count, __ATOMIC_SEQ_CST) <= 0)        \
            return NVML_ERROR_UNINITIALIZED;                            \
    } while (0)

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    REQUIRE_INIT();
    struct scenario s;
    nvmlReturn_t rc = enter(&s, "nvmlSystemGetDriverVersion", -1);
    return rc ? rc : copy_string(version, length, s.driver_version);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    REQUIRE_INIT();
    struct scenario s;
    nvmlReturn_t rc = enter(&s, "nvmlDeviceGetCount_v2", -1);
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)s.ngpus;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    struct scenario s;
    nvmlReturn_t rc = enter(&s, "nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (rc)
        return rc;
    if (!device || index >= (unsigned int)s.ngpus || !s.gpus[index].present)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &handles[index];
    return NVML_SUCCESS;
}

/* Prologue for per-device calls: init check, scenario, rules, handle check. */
#define DEVICE_ENTER(symbol)                                            \
    REQUIRE_INIT();                                                     \
    struct scenario s;                                                  \
    int idx = (device >= &handles[0] && device < &handles[MAX_GPUS])    \
                  ? (int)(device - &handles[0]) : -1;                   \
    nvmlReturn_t rc = enter(&s, symbol, idx);                           \
    if (rc)                                                             \
        return rc;                                                      \
    idx = device_index(&s, device);                                     \
    if (idx < 0)                                                        \
        return NVML_ERROR_INVALID_ARGUMENT;                             \
    struct gpu *g = &s.gpus[idx]

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEVICE_ENTER("nvmlDeviceGetName");
    return copy_string(name, length, g->name);
}

#ifndef FAKE_NVML_NO_UUID
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEVICE_ENTER("nvmlDeviceGetUUID");
    if (!g->has_uuid)
        return NVML_ERROR_NOT_SUPPORTED;
    return copy_string(uuid, length, g->uuid);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    DEVICE_ENTER("nvmlDeviceGetMemoryInfo_v2");
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* Real drivers reject a struct of another version; so does the fake. */
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long calls = __atomic_fetch_add(&memory_calls[idx], 1, __ATOMIC_SEQ_CST);
    unsigned long long used = g->used + g->grow * calls;
    unsigned long long taken = g->reserved + used;
    memory->total = g->total;
    memory->reserved = g->reserved;
    memory->used = used;
    memory->free = taken < g->total ? g->total - taken : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                           unsigned int *infoCount,
                                                           nvmlProcessInfo_t *infos)
{
    DEVICE_ENTER("nvmlDeviceGetComputeRunningProcesses_v3");
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g->bogus_count) {
        *infoCount = 0xFFFFFFFFu;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    /* Two-call protocol: too small a buffer (or none) gets the needed count. */
    unsigned int have = *infoCount;
    *infoCount = (unsigned int)g->nprocs;
    if (g->nprocs == 0)
        return NVML_SUCCESS;
    if (!infos || have < (unsigned int)g->nprocs)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int i = 0; i < g->nprocs; i++) {
        infos[i].pid = g->pids[i];
        infos[i].usedGpuMemory = g->proc_used[i];
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEVICE_ENTER("nvmlDeviceGetUtilizationRates");
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->has_util)
        return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = g->util;
    utilization->memory = g->util;
    return NVML_SUCCESS;
}
