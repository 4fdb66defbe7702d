/* verify.capture._stats: the statistics of a CPU tensor (min, max, mean, L2 norm, NaN and inf counts) in one pass.
Its STATISTICS names them, in the order summarize returns them: verify/capture/tensor_stats.py places them into the
table of verify/record/statistics.py by those names, and computes the table's other statistics with torch.

Why: on the CPU, torch needs three passes for these (aminmax, sum, vector_norm), ~380 us for a 2 MB tensor, and the
capture summarises every op's output; this reads it once (~110 us). It is an optional speed-up: when this module was
not built, verify.capture.ops reduces with torch, and a test checks that both give the same numbers.

Accuracy: float lanes sum blocks of BLOCK elements (a few hundred per lane, so their rounding stays near float's
epsilon), and the blocks are added in double. NaN is never taken as a min or max by the kernels; the counts say when
there was one (a second pass counts NaN and inf, only when the sums are not finite), and then min and max are NaN, as
torch.aminmax gives.

The caller passes the address of a live contiguous CPU tensor's data and its element count; nothing is kept. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* BACKWARDS: the kernels read a tensor from its end. The op that wrote it just now went from the start, so its end
   is still in the cache and its start was the first to leave; reading from the start would push out the end
   before reaching it (a 2 MB output: 203 us read backwards, 246 us forwards, on a 2 MB L2). */

#define LANES 16    /* independent accumulators, so that the compiler keeps them in vector registers */
#define BLOCK 4096  /* elements summed in float before their sum is added in double */

/* x86-64: every kernel is also built for AVX2 with F16C (whose instruction converts eight halves at once), chosen
   at import when the CPU has both; elsewhere (aarch64 has NEON, and half floats, as its baseline) one build. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WIDE_BUILD 1
#define WIDE_TARGET __attribute__((target("avx2,f16c")))
static int cpu_is_wide = 0;
#define CHOOSE(KERNEL) (cpu_is_wide ? KERNEL##_wide : KERNEL##_base)
#else
#define CHOOSE(KERNEL) KERNEL##_base
#endif

typedef struct {
    double low, high, sum, squares;
} FloatStats;

static inline float float_of_bits(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline float from_float(float value) { return value; }

static inline double from_double(double value) { return value; }

static inline float from_bfloat16(uint16_t value) { return float_of_bits((uint32_t)value << 16); }

#ifdef __FLT16_MAX__
static inline float from_half(_Float16 value) { return (float)value; }
typedef _Float16 half;
#else
/* IEEE half to float without branches: the half's exponent and mantissa moved into a float's place read as
   2^-112 times the value (subnormals included), so one multiplication rescales it; inf and NaN keep all ones. */
static inline float from_half(uint16_t value) {
    uint32_t sign = (uint32_t)(value & 0x8000) << 16;
    uint32_t magnitude = (uint32_t)(value & 0x7fff) << 13;
    float scaled = float_of_bits(magnitude) * 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &scaled, sizeof bits);
    bits = (value & 0x7c00) == 0x7c00 ? (magnitude | 0x7f800000) : bits;
    return float_of_bits(bits | sign);
}
typedef uint16_t half;
#endif

/* One pass: min and max over everything, sums per block of lanes. LANE is the accumulator type (float for the
   formats float holds exactly, double for double). */
#define FLOAT_STATS(NAME, TYPE, LANE, LOAD, TARGET)                                                     \
    TARGET static void NAME(const TYPE *data, Py_ssize_t count, FloatStats *out) {                      \
        LANE low[LANES], high[LANES];                                                                   \
        double sum = 0, squares = 0;                                                                    \
        for (int lane = 0; lane < LANES; lane++) {                                                      \
            low[lane] = INFINITY;                                                                       \
            high[lane] = -INFINITY;                                                                     \
        }                                                                                               \
        Py_ssize_t whole = count - count % LANES; /* BLOCK is a multiple of LANES */                    \
        for (Py_ssize_t end = whole; end > 0; end -= BLOCK) { /* from the end: see BACKWARDS */         \
            Py_ssize_t start = end > BLOCK ? end - BLOCK : 0;                                           \
            LANE block_sum[LANES] = {0}, block_squares[LANES] = {0};                                    \
            for (Py_ssize_t i = start; i < end; i += LANES)                                             \
                for (int lane = 0; lane < LANES; lane++) {                                              \
                    LANE value = LOAD(data[i + lane]);                                                  \
                    low[lane] = value < low[lane] ? value : low[lane];                                  \
                    high[lane] = value > high[lane] ? value : high[lane];                               \
                    block_sum[lane] += value;                                                           \
                    block_squares[lane] += value * value;                                               \
                }                                                                                       \
            for (int lane = 0; lane < LANES; lane++) {                                                  \
                sum += block_sum[lane];                                                                 \
                squares += block_squares[lane];                                                         \
            }                                                                                           \
        }                                                                                               \
        double lowest = INFINITY, highest = -INFINITY;                                                  \
        for (int lane = 0; lane < LANES; lane++) {                                                      \
            lowest = low[lane] < lowest ? low[lane] : lowest;                                           \
            highest = high[lane] > highest ? high[lane] : highest;                                      \
        }                                                                                               \
        for (Py_ssize_t i = whole; i < count; i++) {                                                    \
            double value = LOAD(data[i]);                                                               \
            lowest = value < lowest ? value : lowest;                                                   \
            highest = value > highest ? value : highest;                                                \
            sum += value;                                                                               \
            squares += value * value;                                                                   \
        }                                                                                               \
        out->low = lowest;                                                                              \
        out->high = highest;                                                                            \
        out->sum = sum;                                                                                 \
        out->squares = squares;                                                                         \
    }

/* Each kernel once for any CPU (_base) and, on x86-64, once for AVX2 (_wide). */
#ifdef WIDE_BUILD
#define BOTH_BUILDS(MACRO, NAME, ...) MACRO(NAME##_base, __VA_ARGS__, ) MACRO(NAME##_wide, __VA_ARGS__, WIDE_TARGET)
#else
#define BOTH_BUILDS(MACRO, NAME, ...) MACRO(NAME##_base, __VA_ARGS__, )
#endif

BOTH_BUILDS(FLOAT_STATS, stats_float32, float, float, from_float)
BOTH_BUILDS(FLOAT_STATS, stats_float64, double, double, from_double)
FLOAT_STATS(stats_float16_base, half, float, from_half, )
BOTH_BUILDS(FLOAT_STATS, stats_bfloat16, uint16_t, float, from_bfloat16)

#ifdef WIDE_BUILD
#include <immintrin.h>

/* Compilers convert halves one at a time; F16C converts eight. Blocks are converted into a float buffer (it stays in
   the L1 cache) and summarised by the float32 kernel. */
WIDE_TARGET static void stats_float16_wide(const half *data, Py_ssize_t count, FloatStats *out) {
    float buffer[BLOCK];
    FloatStats part;
    *out = (FloatStats){INFINITY, -INFINITY, 0, 0};
    for (Py_ssize_t end = count; end > 0; end -= BLOCK) { /* from the end: see BACKWARDS */
        Py_ssize_t start = end > BLOCK ? end - BLOCK : 0, size = end - start, i = 0;
        for (; i + 8 <= size; i += 8)
            _mm256_storeu_ps(buffer + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(data + start + i))));
        for (; i < size; i++) buffer[i] = from_half(data[start + i]);
        stats_float32_wide(buffer, size, &part);
        out->low = part.low < out->low ? part.low : out->low;
        out->high = part.high > out->high ? part.high : out->high;
        out->sum += part.sum;
        out->squares += part.squares;
    }
}
#endif

/* The second pass, when a sum is not finite: the NaN and inf counts. */
#define COUNT_NONFINITE(NAME, TYPE, LOAD)                                                               \
    static void NAME(const TYPE *data, Py_ssize_t count, long long *nan, long long *inf) {              \
        for (Py_ssize_t i = 0; i < count; i++) {                                                        \
            double value = LOAD(data[i]);                                                               \
            *nan += isnan(value) != 0;                                                                  \
            *inf += isinf(value) != 0; /* glibc's isinf gives -1 for -inf */                            \
        }                                                                                               \
    }

COUNT_NONFINITE(nonfinite_float32, float, from_float)
COUNT_NONFINITE(nonfinite_float64, double, from_double)
COUNT_NONFINITE(nonfinite_float16, half, from_half)
COUNT_NONFINITE(nonfinite_bfloat16, uint16_t, from_bfloat16)

/* Integers (indices, token ids, labels) are compared exactly: their sum and sum of squares too, in double, which
   holds them exactly up to 2^53. */
#define INTEGER_EXTREMES(NAME, TYPE, TARGET)                                                            \
    TARGET static void NAME(const TYPE *data, Py_ssize_t count, FloatStats *stats) {                    \
        TYPE lowest = data[count - 1], highest = data[count - 1];                                       \
        double sum = 0.0, squares = 0.0;                                                                \
        for (Py_ssize_t i = count - 1; i >= 0; i--) { /* from the end: see BACKWARDS */                 \
            lowest = data[i] < lowest ? data[i] : lowest;                                               \
            highest = data[i] > highest ? data[i] : highest;                                            \
            sum += (double)data[i];                                                                     \
            squares += (double)data[i] * (double)data[i];                                               \
        }                                                                                               \
        stats->low = (double)lowest;                                                                    \
        stats->high = (double)highest;                                                                  \
        stats->sum = sum;                                                                               \
        stats->squares = squares;                                                                       \
    }

BOTH_BUILDS(INTEGER_EXTREMES, extremes_int64, int64_t)
BOTH_BUILDS(INTEGER_EXTREMES, extremes_int32, int32_t)
BOTH_BUILDS(INTEGER_EXTREMES, extremes_uint8, uint8_t)

#define RUN_FLOAT(KIND, TYPE)                                                                           \
    do {                                                                                                \
        Py_BEGIN_ALLOW_THREADS CHOOSE(stats_##KIND)((const TYPE *)data, count, &stats);                 \
        if (!isfinite(stats.sum) || !isfinite(stats.squares))                                           \
            nonfinite_##KIND((const TYPE *)data, count, &nan, &inf);                                    \
        Py_END_ALLOW_THREADS                                                                            \
    } while (0)

#define RUN_INTEGER(KERNEL, TYPE)                                                                       \
    do {                                                                                                \
        Py_BEGIN_ALLOW_THREADS CHOOSE(KERNEL)((const TYPE *)data, count, &stats);                       \
        Py_END_ALLOW_THREADS                                                                            \
    } while (0)

/* The names of summarize's values, in their order. */
#define STATISTICS_NAMES "min", "max", "mean", "l2_norm", "nan_count", "inf_count"

PyDoc_STRVAR(summarize_doc,
             "summarize(address, count, kind) -> (min, max, mean, l2_norm, nan_count, inf_count), named by "
             "STATISTICS, for the float kinds 'float32', 'float64', 'float16', 'bfloat16' and the integer kinds "
             "'int64', 'int32', 'uint8' (bool too; counts 0). address: a live contiguous CPU tensor's data_ptr(); "
             "count > 0: its numel(). min and max are NaN where there was a NaN.");

static PyObject *summarize(PyObject *self, PyObject *args) {
    unsigned long long address;
    Py_ssize_t count;
    const char *kind;
    if (!PyArg_ParseTuple(args, "Kns", &address, &count, &kind)) return NULL;
    if (address == 0 || count <= 0) {
        PyErr_SetString(PyExc_ValueError, "summarize needs a data address and a positive element count");
        return NULL;
    }
    const void *data = (const void *)(uintptr_t)address;
    FloatStats stats;
    long long nan = 0, inf = 0;
    if (strcmp(kind, "float32") == 0) RUN_FLOAT(float32, float);
    else if (strcmp(kind, "float64") == 0) RUN_FLOAT(float64, double);
    else if (strcmp(kind, "float16") == 0) RUN_FLOAT(float16, half);
    else if (strcmp(kind, "bfloat16") == 0) RUN_FLOAT(bfloat16, uint16_t);
    else if (strcmp(kind, "int64") == 0) RUN_INTEGER(extremes_int64, int64_t);
    else if (strcmp(kind, "int32") == 0) RUN_INTEGER(extremes_int32, int32_t);
    else if (strcmp(kind, "uint8") == 0) RUN_INTEGER(extremes_uint8, uint8_t);
    else {
        PyErr_Format(PyExc_ValueError, "summarize: unsupported kind %s", kind);
        return NULL;
    }
    if (nan) stats.low = stats.high = NAN;
    return Py_BuildValue("(ddddLL)", stats.low, stats.high, stats.sum / (double)count, sqrt(stats.squares), nan, inf);
}

static PyMethodDef methods[] = {
    {"summarize", summarize, METH_VARARGS, summarize_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "verify.capture._stats", "One-pass statistics of CPU tensors (see verify/capture/_stats.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__stats(void) {
#ifdef WIDE_BUILD
    __builtin_cpu_init();
    cpu_is_wide = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#endif
    PyObject *created = PyModule_Create(&module);
    if (created == NULL) return NULL;
    PyObject *names = Py_BuildValue("(ssssss)", STATISTICS_NAMES);
    if (names == NULL || PyModule_AddObject(created, "STATISTICS", names) < 0) {
        Py_XDECREF(names);
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
