/* A stand-in libcuda.so.1 for CPU tests: a CUDA 13.0 driver's symbol set, no GPU.

   cuda-bindings finds every driver function through cuGetProcAddress. This library answers
   it for exactly the names listed in the file $PAGECAST_STANDIN_CUDA_SYMBOLS (one per line:
   tests/data/cuda13.0-surface.json's driver functions, the CUDA 13.0 driver API), and
   CUDA_ERROR_NOT_FOUND for any other name, as a 13.0 driver does for a function added later.
   A listed function that is not implemented below answers CUDA_ERROR_NOT_SUPPORTED.

   Implemented: cuInit, cuDriverGetVersion (13000), and the parameter/name queries for three
   handles: CUfunction 0x1000 (float*, float*, int), CUkernel 0x2000 (double*, int), and
   CUfunction 0x3000 (no parameters). cuFuncGetParamCount / cuKernelGetParamCount are
   implemented too, but a 13.0 driver does not hand them out (they are not in the list). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801

static char **names;
static size_t n_names;

static void load_names(void) {
    if (names) return;
    names = calloc(1, sizeof(char *));
    const char *path = getenv("PAGECAST_STANDIN_CUDA_SYMBOLS");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        names = realloc(names, (n_names + 1) * sizeof(char *));
        names[n_names++] = strdup(line);
    }
    fclose(f);
}

static int listed(const char *sym) {
    load_names();
    for (size_t i = 0; i < n_names; i++)
        if (strcmp(names[i], sym) == 0) return 1;
    return 0;
}

static CUresult not_supported(void) { return CUDA_ERROR_NOT_SUPPORTED; }

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }

static const size_t FN_OFF[] = {0, 8, 16}, FN_SIZE[] = {8, 8, 4};
static const size_t K_OFF[] = {0, 8}, K_SIZE[] = {8, 4};

CUresult cuFuncGetParamInfo(void *f, size_t i, size_t *off, size_t *size) {
    if (f == (void *)0x1000) {
        if (i >= 3) return CUDA_ERROR_INVALID_VALUE;
        *off = FN_OFF[i]; *size = FN_SIZE[i]; return CUDA_SUCCESS;
    }
    if (f == (void *)0x3000) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuKernelGetParamInfo(void *k, size_t i, size_t *off, size_t *size) {
    if (k != (void *)0x2000) return CUDA_ERROR_INVALID_HANDLE;
    if (i >= 2) return CUDA_ERROR_INVALID_VALUE;
    *off = K_OFF[i]; *size = K_SIZE[i]; return CUDA_SUCCESS;
}

CUresult cuFuncGetParamCount(void *f, size_t *n) {
    if (f == (void *)0x1000) { *n = 3; return CUDA_SUCCESS; }
    if (f == (void *)0x3000) { *n = 0; return CUDA_SUCCESS; }
    return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuKernelGetParamCount(void *k, size_t *n) {
    if (k != (void *)0x2000) return CUDA_ERROR_INVALID_HANDLE;
    *n = 2; return CUDA_SUCCESS;
}

CUresult cuFuncGetName(const char **name, void *f) {
    if (f == (void *)0x1000) { *name = "_Z5saxpyPfS_i"; return CUDA_SUCCESS; }
    if (f == (void *)0x3000) { *name = "noargs"; return CUDA_SUCCESS; }
    return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuKernelGetName(const char **name, void *k) {
    if (k != (void *)0x2000) return CUDA_ERROR_INVALID_HANDLE;
    *name = "scale"; return CUDA_SUCCESS;
}

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status) {
    (void)version; (void)flags;
    if (!listed(sym)) {
        *pfn = NULL;
        if (status) *status = 1;   /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
        return CUDA_ERROR_NOT_FOUND;
    }
    static const struct { const char *name; void *fn; } impl[] = {
        {"cuInit", (void *)cuInit}, {"cuDriverGetVersion", (void *)cuDriverGetVersion},
        {"cuFuncGetParamInfo", (void *)cuFuncGetParamInfo}, {"cuKernelGetParamInfo", (void *)cuKernelGetParamInfo},
        {"cuFuncGetParamCount", (void *)cuFuncGetParamCount}, {"cuKernelGetParamCount", (void *)cuKernelGetParamCount},
        {"cuFuncGetName", (void *)cuFuncGetName}, {"cuKernelGetName", (void *)cuKernelGetName},
        {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
    };
    *pfn = (void *)not_supported;
    for (size_t i = 0; i < sizeof impl / sizeof impl[0]; i++)
        if (strcmp(impl[i].name, sym) == 0) *pfn = impl[i].fn;
    if (status) *status = 0;       /* CU_GET_PROC_ADDRESS_SUCCESS */
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags) {
    int status = 0;
    return cuGetProcAddress_v2(sym, pfn, version, flags, &status);
}
