/* gpuenv's NVTX injection library: NVTX ranges become `gpuenv run` regions.

   `gpuenv run --regions nvtx` builds this file with the C compiler (once, cached)
   and names it in NVTX_INJECTION64_PATH. The NVTX code inside the command (the
   header-only NVTX 3 that PyTorch, NCCL and the `nvtx` package compile in, or
   libnvToolsExt) loads it on the process's first NVTX call and calls
   InitializeInjectionNvtx2, which points the push/pop and start/end entries at
   the functions below. Each writes one region edge (gpuenv/run/region.py) to
   GPUENV_REGION_FD. No profiler and no GPU take part: this is host code.

   The few NVTX types used here are declared below as NVTX 3's nvToolsExt.h and
   nvtxDetail/nvtxTypes.h define them (the injection ABI is stable across NVTX
   versions), so building needs no NVTX headers. Region ids start at 2^48 so
   that they never meet the ids gpuenv.region() uses in the same process. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *out_table, unsigned int *out_size);
} NvtxExportTableCallbacks;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t exportTableId);

enum { ETID_CALLBACKS = 1, MODULE_CORE = 1, MODULE_CORE2 = 5 };
enum { CORE_RangeStartEx = 4, CORE_RangeStartA = 5, CORE_RangeStartW = 6, CORE_RangeEnd = 7,
       CORE_RangePushEx = 8, CORE_RangePushA = 9, CORE_RangePushW = 10, CORE_RangePop = 11 };
enum { CORE2_DomainRangeStartEx = 2, CORE2_DomainRangeEnd = 3, CORE2_DomainRangePushEx = 4,
       CORE2_DomainRangePop = 5, CORE2_DomainRegisterStringA = 10 };
enum { MESSAGE_ASCII = 1, MESSAGE_UNICODE = 2, MESSAGE_REGISTERED = 3 };

typedef struct {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t colorType;
    uint32_t color;
    int32_t payloadType;
    int32_t reserved0;
    uint64_t payload;
    int32_t messageType;
    const void *message; /* ascii, unicode or a registered string handle */
} nvtxEventAttributes_t;

#define MAX_DEPTH 256
#define FIRST_ID (1ULL << 48)

static int region_fd = -1;
static uint64_t next_id = FIRST_ID;
static __thread uint64_t stack[MAX_DEPTH];
static __thread int depth;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void edge(char kind, uint64_t id, const char *name) {
    char line[320];
    int n;
    if (region_fd < 0 || id == 0) return;
    if (kind == 'b')
        n = snprintf(line, sizeof line, "b %d %llu %.9f %.200s\n", (int)getpid(),
                     (unsigned long long)id, now(), name && *name ? name : "(nvtx)");
    else
        n = snprintf(line, sizeof line, "e %d %llu %.9f\n", (int)getpid(),
                     (unsigned long long)id, now());
    for (char *p = line; kind == 'b' && *p != '\n'; ++p)
        if (*p == '\r') *p = ' ';
    if (n > 0 && write(region_fd, line, (size_t)n) < 0) region_fd = -1; /* gpuenv went away */
}

static const char *text_of(const nvtxEventAttributes_t *a, char *buf, size_t size) {
    if (!a || !a->message) return NULL;
    if (a->messageType == MESSAGE_ASCII || a->messageType == MESSAGE_REGISTERED)
        return (const char *)a->message; /* registered handles are our own strdup()s */
    if (a->messageType == MESSAGE_UNICODE) {
        snprintf(buf, size, "%ls", (const wchar_t *)a->message);
        return buf;
    }
    return NULL;
}

static uint64_t new_id(void) { return __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED); }

static int push(const char *name) {
    uint64_t id = new_id();
    if (depth < MAX_DEPTH) stack[depth] = id;
    ++depth;
    edge('b', id, name);
    return depth - 1;
}

static int pop(void) {
    if (depth <= 0) return -1;
    --depth;
    if (depth < MAX_DEPTH) edge('e', stack[depth], NULL);
    return depth;
}

static uint64_t start(const char *name) {
    uint64_t id = new_id();
    edge('b', id, name);
    return id;
}

static int RangePushA(const char *m) { return push(m); }
static int RangePushW(const wchar_t *m) { char b[256]; snprintf(b, sizeof b, "%ls", m); return push(b); }
static int RangePushEx(const nvtxEventAttributes_t *a) { char b[256]; return push(text_of(a, b, sizeof b)); }
static int RangePop(void) { return pop(); }
static uint64_t RangeStartA(const char *m) { return start(m); }
static uint64_t RangeStartW(const wchar_t *m) { char b[256]; snprintf(b, sizeof b, "%ls", m); return start(b); }
static uint64_t RangeStartEx(const nvtxEventAttributes_t *a) { char b[256]; return start(text_of(a, b, sizeof b)); }
static void RangeEnd(uint64_t id) { edge('e', id, NULL); }
static int DomainRangePushEx(void *d, const nvtxEventAttributes_t *a) { (void)d; return RangePushEx(a); }
static int DomainRangePop(void *d) { (void)d; return pop(); }
static uint64_t DomainRangeStartEx(void *d, const nvtxEventAttributes_t *a) { (void)d; return RangeStartEx(a); }
static void DomainRangeEnd(void *d, uint64_t id) { (void)d; edge('e', id, NULL); }
static void *DomainRegisterStringA(void *d, const char *s) { (void)d; return s ? strdup(s) : NULL; }

static int find_fd(void) {
    const char *raw = getenv("GPUENV_REGION_FD"), *want = getenv("GPUENV_REGION_PIPE");
    struct stat st;
    char have[64];
    int fd;
    if (!raw) return -1;
    fd = atoi(raw);
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return -1;
    snprintf(have, sizeof have, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    return want && strcmp(want, have) != 0 ? -1 : fd; /* the number was reused for another file */
}

#define SLOT(module, id, fn) {module, id, (NvtxFunctionPointer)fn}
static const struct { int module; unsigned int id; NvtxFunctionPointer fn; } slots[] = {
    SLOT(MODULE_CORE, CORE_RangePushA, RangePushA),
    SLOT(MODULE_CORE, CORE_RangePushW, RangePushW),
    SLOT(MODULE_CORE, CORE_RangePushEx, RangePushEx),
    SLOT(MODULE_CORE, CORE_RangePop, RangePop),
    SLOT(MODULE_CORE, CORE_RangeStartA, RangeStartA),
    SLOT(MODULE_CORE, CORE_RangeStartW, RangeStartW),
    SLOT(MODULE_CORE, CORE_RangeStartEx, RangeStartEx),
    SLOT(MODULE_CORE, CORE_RangeEnd, RangeEnd),
    SLOT(MODULE_CORE2, CORE2_DomainRangePushEx, DomainRangePushEx),
    SLOT(MODULE_CORE2, CORE2_DomainRangePop, DomainRangePop),
    SLOT(MODULE_CORE2, CORE2_DomainRangeStartEx, DomainRangeStartEx),
    SLOT(MODULE_CORE2, CORE2_DomainRangeEnd, DomainRangeEnd),
    SLOT(MODULE_CORE2, CORE2_DomainRegisterStringA, DomainRegisterStringA),
};

static void after_fork(void) { depth = 0; }

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
    const NvtxExportTableCallbacks *cb = get ? get(ETID_CALLBACKS) : NULL;
    static const int modules[] = {MODULE_CORE, MODULE_CORE2};
    if (!cb || !cb->GetModuleFunctionTable) return 0;
    region_fd = find_fd();
    pthread_atfork(NULL, NULL, after_fork);
    for (size_t m = 0; m < sizeof modules / sizeof *modules; ++m) {
        NvtxFunctionTable table = NULL;
        unsigned int size = 0;
        if (!cb->GetModuleFunctionTable(modules[m], &table, &size) || !table) continue;
        for (size_t k = 0; k < sizeof slots / sizeof *slots; ++k)
            if (slots[k].module == modules[m] && slots[k].id < size && table[slots[k].id])
                *table[slots[k].id] = slots[k].fn;
    }
    return 1;
}
