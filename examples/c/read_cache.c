/*
 * read_cache.c: read dataset_rt caches from C, without Python.
 *
 *   read_cache [--shuffle] [--seed N] [--epoch-len N] [--validate]
 *              [--backend auto|io_uring|threads] CACHE_PATH...
 *
 * Opens a runtime with 2 worker threads and one dataset over every CACHE_PATH (in the
 * order given), prints
 *
 *   samples <total sample count of the caches>
 *
 * then reads one window of the dataset's stream (epoch length samples: ordered, or
 * drawn with replacement with --shuffle) and prints one line per sample:
 *
 *   <cache_id> <sample_id> <payload length> <sha256 of the payload, lowercase hex>
 *
 * The same configuration in Python yields the same samples in the same order:
 *
 *   ds = dataset_rt.DatasetRuntime(num_workers=2).cached_dataset(
 *       paths, reader_config=dataset_rt.ReaderConfig(seed=N, shuffle=..., validate_cache=...))
 *   ds.set_epoch_len(N)   # only with --epoch-len
 *   for s in ds: print(s.cache_id, s.sample_id, len(s.data), hashlib.sha256(s.data).hexdigest())
 *
 * --validate verifies the caches first: it opens them once with validate_cache = 1, which
 * checks every file's SHA-256 against the manifest (index.bin, metadata.arrow, the
 * shards), and closes that dataset again. The samples are then read with
 * validate_cache = 0: the checksums are what --validate is about here (opening the
 * reading dataset with validate_cache = 1 instead would also compare every record with
 * its metadata.arrow row, which the library reads itself). For intact caches the output
 * equals Python's validate_cache=True.
 *
 * Every dataset_rt call is checked: on failure the program prints
 * "error: <drt_last_error()>" to stderr and exits with status 1 (2 for a usage error).
 * Every handle is closed and every allocation freed on all paths.
 *
 * Build (see docs/c-api.md), with the library installed into PREFIX, statically (with
 * zig cc, which supplies Zig's compiler runtime) or against the shared library:
 *   python -m ziglang cc -std=c11 read_cache.c -I PREFIX/include \
 *       PREFIX/lib/libdataset_rt.a -lc -o read_cache
 *   cc -std=c11 read_cache.c -I PREFIX/include -L PREFIX/lib -ldataset_rt \
 *       -Wl,-rpath,PREFIX/lib -o read_cache
 *
 * This file is in the public domain (CC0): copy what you need.
 */

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset_rt.h"

/* ------------------------------------------------------------------ SHA-256 (FIPS 180-4)
 * A small, self-contained implementation so the example needs nothing but libc. It
 * favours clarity over speed. */

typedef struct sha256_ctx {
    uint32_t state[8];
    uint64_t length;      /* bytes hashed so far */
    uint8_t block[64];    /* pending input, block_len bytes */
    size_t block_len;
} sha256_ctx;

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr32(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static void sha256_compress(uint32_t state[8], const uint8_t block[64]) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) {
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
               (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr32(w[i - 15], 7) ^ rotr32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr32(w[i - 2], 17) ^ rotr32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25)) + ((e & f) ^ (~e & g)) +
                      sha256_k[i] + w[i];
        uint32_t t2 = (rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
}

static void sha256_init(sha256_ctx *ctx) {
    static const uint32_t initial[8] = {
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
    };
    memcpy(ctx->state, initial, sizeof initial);
    ctx->length = 0;
    ctx->block_len = 0;
}

static void sha256_update(sha256_ctx *ctx, const uint8_t *data, size_t len) {
    ctx->length += len;
    while (len > 0) {
        size_t take = sizeof ctx->block - ctx->block_len;
        if (take > len) take = len;
        memcpy(ctx->block + ctx->block_len, data, take);
        ctx->block_len += take;
        data += take;
        len -= take;
        if (ctx->block_len == sizeof ctx->block) {
            sha256_compress(ctx->state, ctx->block);
            ctx->block_len = 0;
        }
    }
}

/* Pads the message, and writes the digest as 64 lowercase hex digits plus a NUL. */
static void sha256_final_hex(sha256_ctx *ctx, char hex[65]) {
    uint64_t bit_length = ctx->length * 8;
    uint8_t padding[72] = {0x80}; /* 0x80, zeros up to 56 mod 64, then the 64-bit length */
    size_t pad_len = (ctx->block_len < 56 ? 56 : 120) - ctx->block_len;
    for (int i = 0; i < 8; i++) padding[pad_len + i] = (uint8_t)(bit_length >> (56 - 8 * i));
    sha256_update(ctx, padding, pad_len + 8);
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        uint8_t byte = (uint8_t)(ctx->state[i / 4] >> (24 - 8 * (i % 4)));
        hex[2 * i] = digits[byte >> 4];
        hex[2 * i + 1] = digits[byte & 0xf];
    }
    hex[64] = '\0';
}

/* ----------------------------------------------------------------- command line */

typedef struct options {
    drt_dataset_options dataset; /* validate_cache stays 0: see verify_caches */
    int validate;
    int has_epoch_len;
    uint64_t epoch_len;
    char **paths; /* argv entries */
    uint64_t path_count;
} options;

static const char usage[] =
    "usage: read_cache [--shuffle] [--seed N] [--epoch-len N] [--validate]\n"
    "                  [--backend auto|io_uring|threads] CACHE_PATH...\n";

/* Parses a decimal uint64_t; returns 0 on success. */
static int parse_u64(const char *text, uint64_t *out) {
    if (text == NULL || *text < '0' || *text > '9') return -1; /* strtoull accepts "-1" */
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0') return -1;
    *out = (uint64_t)value;
    return 0;
}

/* Fills *opts from argv; returns 0 on success, -1 after printing a usage error. */
static int parse_args(int argc, char **argv, options *opts) {
    *opts = (options){
        .dataset = {
            .seed = 0,
            .prefetch_size = 64, /* the Python ReaderConfig default */
            .shuffle = 0,
            .validate_cache = 0,
            .io_backend = DRT_IO_AUTO,
            .sampling = DRT_SAMPLING_WITH_REPLACEMENT,
        },
    };
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        } else if (strcmp(arg, "--shuffle") == 0) {
            opts->dataset.shuffle = 1;
        } else if (strcmp(arg, "--validate") == 0) {
            opts->validate = 1;
        } else if (strcmp(arg, "--seed") == 0) {
            if (parse_u64(value, &opts->dataset.seed) != 0) goto bad_value;
            i++;
        } else if (strcmp(arg, "--epoch-len") == 0) {
            if (parse_u64(value, &opts->epoch_len) != 0) goto bad_value;
            opts->has_epoch_len = 1;
            i++;
        } else if (strcmp(arg, "--backend") == 0) {
            if (value == NULL) goto bad_value;
            if (strcmp(value, "auto") == 0) opts->dataset.io_backend = DRT_IO_AUTO;
            else if (strcmp(value, "io_uring") == 0) opts->dataset.io_backend = DRT_IO_URING;
            else if (strcmp(value, "threads") == 0) opts->dataset.io_backend = DRT_IO_THREADS;
            else goto bad_value;
            i++;
        } else {
            fprintf(stderr, "read_cache: unknown option %s\n%s", arg, usage);
            return -1;
        }
        continue;
    bad_value:
        fprintf(stderr, "read_cache: bad or missing value for %s\n%s", arg, usage);
        return -1;
    }
    if (i == argc) {
        fprintf(stderr, "read_cache: no CACHE_PATH given\n%s", usage);
        return -1;
    }
    opts->paths = argv + i;
    opts->path_count = (uint64_t)(argc - i);
    return 0;
}

/* ------------------------------------------------------------------------ main */

/* Reports the calling thread's last dataset_rt failure. Read it at once: the next failing
 * call on this thread replaces the message. */
static void report_error(void) { fprintf(stderr, "error: %s\n", drt_last_error()); }

/* Evaluates a dataset_rt call; on a failing status, reports it and jumps to cleanup. */
#define CHECK(call)                    \
    do {                               \
        if ((call) != DRT_OK) {        \
            report_error();            \
            goto cleanup;              \
        }                              \
    } while (0)

/* Opens the caches once with validate_cache = 1 (structure and every file's SHA-256) and
 * closes them again. Returns DRT_OK or the failing status. */
static int32_t verify_caches(drt_runtime *runtime, const drt_str *paths, uint64_t path_count,
                             const drt_dataset_options *read_options) {
    drt_dataset_options options = *read_options;
    options.validate_cache = 1;
    drt_dataset *dataset = NULL;
    int32_t status = drt_dataset_open(runtime, paths, path_count, &options, &dataset);
    drt_dataset_close(dataset); /* NULL when the open failed: a no-op */
    return status;
}

enum { BATCH_SAMPLES_MAX = 256 }; /* a batch also holds at most prefetch_size / 2 */

int main(int argc, char **argv) {
    options opts;
    if (parse_args(argc, argv, &opts) != 0) return 2;

    /* A binding refuses a library whose ABI major differs from its header's, or whose
       minor is older (it may lack functions this program calls). */
    uint32_t abi = drt_abi_version();
    if (abi >> 16 != DRT_ABI_VERSION_MAJOR || (abi & 0xffff) < DRT_ABI_VERSION_MINOR) {
        fprintf(stderr, "error: libdataset_rt %s has ABI %" PRIu32 ".%" PRIu32 "; this program needs %d.%d or a later %d.x\n",
                drt_version(), abi >> 16, abi & 0xffff, DRT_ABI_VERSION_MAJOR, DRT_ABI_VERSION_MINOR, DRT_ABI_VERSION_MAJOR);
        return 1;
    }

    int exit_code = 1;
    drt_runtime *runtime = NULL;
    drt_dataset *dataset = NULL;
    drt_iter *iter = NULL;

    /* Paths go in as (pointer, length) pairs; they are borrowed only for the call. */
    drt_str *paths = calloc((size_t)opts.path_count, sizeof *paths);
    if (paths == NULL) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    for (uint64_t p = 0; p < opts.path_count; p++) {
        paths[p] = (drt_str){.ptr = opts.paths[p], .len = strlen(opts.paths[p])};
    }

    CHECK(drt_runtime_open(2, &runtime));
    if (opts.validate) CHECK(verify_caches(runtime, paths, opts.path_count, &opts.dataset));
    CHECK(drt_dataset_open(runtime, paths, opts.path_count, &opts.dataset, &dataset));
    if (opts.has_epoch_len) CHECK(drt_dataset_set_epoch_len(dataset, opts.epoch_len));

    uint64_t cache_count = 0;
    uint64_t total_samples = 0;
    CHECK(drt_dataset_cache_count(dataset, &cache_count));
    for (uint64_t c = 0; c < cache_count; c++) {
        drt_cache_info info;
        CHECK(drt_dataset_cache_info(dataset, c, &info));
        total_samples += info.sample_count;
    }
    printf("samples %" PRIu64 "\n", total_samples);

    /* One window: the iterator reserves the next epoch-length positions of the stream. */
    CHECK(drt_iter_open(dataset, &iter));
    for (;;) {
        drt_batch batch;
        CHECK(drt_iter_next_batch(iter, BATCH_SAMPLES_MAX, 0, &batch));
        if (batch.count == 0) break;
        /* The batch's buffers belong to the iterator until its next call: use them now. */
        for (uint64_t i = 0; i < batch.count; i++) {
            sha256_ctx sha;
            char hex[65];
            sha256_init(&sha);
            sha256_update(&sha, batch.payloads[i], (size_t)batch.payload_lens[i]);
            sha256_final_hex(&sha, hex);
            printf("%" PRIu64 " %" PRIu64 " %" PRIu64 " %s\n", batch.cache_ids[i], batch.sample_ids[i],
                   batch.payload_lens[i], hex);
        }
    }

    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "error: writing to stdout failed\n");
        goto cleanup;
    }
    exit_code = 0;

cleanup:
    /* Close in reverse order of opening; closing NULL is a no-op. */
    drt_iter_close(iter);
    drt_dataset_close(dataset);
    drt_runtime_close(runtime);
    free(paths);
    return exit_code;
}
