/*
 * dataset_rt.h: the C ABI of the dataset_rt core (https://pypi.org/project/dataset-rt
 * storage format, format_version 3). This header is the single source of truth for the
 * ABI: the Python binding is generated from the region between the DRT_CDEF markers,
 * and a test compares the library's exported drt_* symbols with these declarations.
 *
 * Conventions (apply to every function unless its comment says otherwise):
 *  - Every fallible function returns int32_t: DRT_OK (0) or a negative DRT_E_* status.
 *    On failure, drt_last_error() returns a message for this thread's last failure.
 *    Output parameters are written only on success.
 *  - Handles are opaque and created/destroyed by paired functions. *_close(NULL) is a
 *    no-op. A handle must not be used after it is closed.
 *  - Strings are passed as (pointer, byte length) pairs of UTF-8, or drt_str structs
 *    behind pointers; they need not be NUL-terminated. Paths are byte strings as the
 *    OS sees them. Signatures use only int32_t, uint32_t, uint64_t, double and pointers.
 *  - Thread safety: a handle may be used by one thread at a time unless its comment
 *    says otherwise. Distinct handles may be used concurrently. A dataset may have any
 *    number of iterators and lookups in use on different threads at once. A call on an
 *    iterator or lookup made while another thread's call is inside it returns
 *    DRT_E_INVALID_ARGUMENT ("in use by another thread") and changes nothing; other
 *    handles are not checked.
 *  - Every function taking a handle or an output pointer returns DRT_E_INVALID_ARGUMENT
 *    for NULL ones, and for a non-zero `reserved` field or unknown flag bits.
 *  - Lifetimes: "while the dataset is open" means until its last reference is released
 *    (drt_dataset_close and every iterator and lookup opened from it closed).
 *  - Fork: handles are not fork-safe. In a child process after fork(), every function
 *    taking a handle returns DRT_E_FORKED (closing is a no-op that leaks nothing the
 *    child can reach); open new handles in the child.
 *  - Buffers returned by the library (drt_batch contents, names) are owned by the
 *    library; each comment says how long they stay valid. Callers copy what they keep.
 */
#ifndef DATASET_RT_H
#define DATASET_RT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* DRT_CDEF_BEGIN */

/* ABI version: drt_abi_version() returns major << 16 | minor. Bindings refuse a
 * library whose major differs from the one they were built for. */
enum {
    DRT_ABI_VERSION_MAJOR = 1,
    DRT_ABI_VERSION_MINOR = 18
};

/* Status codes. Append-only: values are never renumbered. */
enum {
    DRT_OK = 0,
    DRT_E_INVALID_ARGUMENT = -1, /* caller mistake (Python: ValueError) */
    DRT_E_INVALID_CACHE = -2,    /* cache data is invalid (ValueError) */
    DRT_E_IO = -3,               /* operating-system I/O failure: "I/O error: ..." (RuntimeError) */
    DRT_E_JSON = -4,             /* manifest or record JSON: "JSON error: ..." (RuntimeError) */
    DRT_E_ARROW = -5,            /* metadata columns: "Arrow error: ..." (RuntimeError) */
    DRT_E_INDEX = -6,            /* unknown cache_id or sample_id (IndexError) */
    DRT_E_OUT_OF_MEMORY = -7,    /* allocation failed (MemoryError) */
    DRT_E_FORKED = -8,           /* handle used in a forked child (RuntimeError) */
    DRT_E_EXISTS = -9,           /* destination cache path already exists */
    DRT_E_OVERFLOW = -10,        /* a count does not fit (OverflowError) */
    DRT_E_INTERNAL = -11         /* a bug in dataset_rt; please report it */
};

/* Metadata value kinds (manifest "bool", "int", "float", "string"). */
enum {
    DRT_KIND_BOOL = 0,
    DRT_KIND_INT = 1,
    DRT_KIND_FLOAT = 2,
    DRT_KIND_STRING = 3
};

/* Shard payload compression. */
enum {
    DRT_COMPRESSION_NONE = 0,
    DRT_COMPRESSION_LZ4 = 1
};

/* Read I/O backends. AUTO picks io_uring where the kernel allows it, else THREADS. */
enum {
    DRT_IO_AUTO = 0,
    DRT_IO_URING = 1,
    DRT_IO_THREADS = 2
};

typedef struct drt_runtime drt_runtime;
typedef struct drt_writer drt_writer;
typedef struct drt_dataset drt_dataset;
typedef struct drt_iter drt_iter;
typedef struct drt_lookup drt_lookup;

/* A byte string (not necessarily NUL-terminated). */
typedef struct drt_str {
    const char *ptr;
    uint64_t len;
} drt_str;

/* One metadata field of a schema. */
typedef struct drt_field {
    drt_str name;
    int32_t kind; /* DRT_KIND_* */
    uint32_t reserved; /* must be 0 */
} drt_field;

/* One metadata column of `count` rows (the count travels beside the column).
 *  bool:   values = uint8_t[count], each 0 or 1
 *  int:    values = int64_t[count]
 *  float:  values = double[count]
 *  string: values = UTF-8 bytes, offsets = uint64_t[count + 1] byte offsets into values
 *          (offsets[0] need not be 0; row i is values[offsets[i] .. offsets[i+1]])
 * offsets is NULL for non-string kinds. */
typedef struct drt_column {
    int32_t kind; /* DRT_KIND_* */
    uint32_t reserved; /* must be 0 */
    const void *values;
    const uint64_t *offsets;
} drt_column;

/* Version of this library, e.g. "0.1.0". Static storage; never NULL. Thread-safe. */
const char *drt_version(void);

/* DRT_ABI_VERSION_MAJOR << 16 | DRT_ABI_VERSION_MINOR of the loaded library. Thread-safe. */
uint32_t drt_abi_version(void);

/* Message for the last failure on the calling thread (NUL-terminated UTF-8; "" when
 * none). Valid until the next failing call on this thread. Thread-safe. */
const char *drt_last_error(void);

/* ---------------------------------------------------------------- runtime */

/* Creates a runtime owning a pool of exactly num_workers threads (>= 1), started now.
 * Datasets and writers opened from it keep it alive: closing the runtime while they
 * are open only drops the caller's reference.
 * Returns DRT_E_INVALID_ARGUMENT ("num_workers must be greater than zero"),
 * DRT_E_OUT_OF_MEMORY, DRT_E_INTERNAL (thread creation failed). */
int32_t drt_runtime_open(uint64_t num_workers, drt_runtime **out);

/* Drops the caller's reference; the threads stop once no dataset or writer uses them. */
void drt_runtime_close(drt_runtime *runtime);

/* ----------------------------------------------------------------- writer */

typedef struct drt_writer_options {
    uint64_t max_shard_bytes;  /* > 0; a shard is closed before a record would overflow it */
    uint64_t prefetch_size;    /* > 0; samples in flight inside the writer */
    int32_t compression;       /* DRT_COMPRESSION_* */
    uint32_t flags;            /* DRT_WRITER_* bits */
    double compression_ratio;  /* recorded in the manifest; 1.0 for NONE; finite, > 0 */
    const char *fingerprint;   /* NULL or a UTF-8 string stored in the manifest (ABI 1.1) */
    uint64_t fingerprint_len;
} drt_writer_options;

/* Writer flags. */
enum {
    DRT_WRITER_PROFILE = 1, /* time every stage (drt_writer_stats); costs a clock read per stage */
    DRT_WRITER_REPLACE = 2, /* publish by atomically exchanging with an existing cache at the
                               destination, then removing the old one (rebuilding a stale
                               cache); datasets that have the old cache open keep reading
                               the files they opened and get DRT_E_INVALID_CACHE ("... was
                               replaced ...") for files they open later, never new bytes */
    DRT_WRITER_METADATA = 4 /* (ABI 1.15) the writer keeps the appended metadata columns and
                               writes metadata.arrow itself at drt_writer_finish; without
                               it the caller writes metadata.arrow into the staging
                               directory and finish checks it */
};

/* Writer stages timed with DRT_WRITER_PROFILE, indexes into drt_writer_stats' array. */
enum {
    DRT_STAGE_RECORD_ENCODE = 0,   /* metadata JSON + record framing; bytes = record headers */
    DRT_STAGE_COMPRESSION = 1,     /* LZ4 (none: the payload's copy); bytes = raw payload bytes */
    DRT_STAGE_DISK_WRITE = 2,      /* shard and index appends (buffered writes; index SHA-256) */
    DRT_STAGE_SHARD_FLUSH = 3,     /* closing shards; sealing them on the pool (read back,
                                      SHA-256, writeback, fsync; bytes = bytes hashed) */
    DRT_STAGE_FINISH_INDEX = 4,    /* index.bin flush + fsync */
    DRT_STAGE_FINISH_METADATA = 5, /* hashing metadata.arrow */
    DRT_STAGE_FINISH_MANIFEST = 6, /* manifest.json write + fsync */
    DRT_STAGE_PUBLISH = 7,         /* directory fsyncs and the rename */
    DRT_STAGE_COUNT = 8
};

typedef struct drt_stage_stats {
    uint64_t calls;
    uint64_t total_ns;
    uint64_t bytes;
} drt_stage_stats;

/* Starts writing the cache `<base_dir>/<name>`. Creates base_dir (with parents) and
 * `<base_dir>/tmp/`, removes abandoned staging directories there whose lock is free,
 * and creates a fresh staging directory `<base_dir>/tmp/<name prefix>.<random>.drt` held under an
 * exclusive flock. Nothing is published until drt_writer_finish().
 * name must be a plain path segment (not empty, no '/', '\\', NUL, not "." / ".." / "tmp").
 * Returns DRT_E_INVALID_ARGUMENT (bad name or options), DRT_E_EXISTS ("cache path
 * already exists: <base>/<name>"), DRT_E_IO, DRT_E_OUT_OF_MEMORY, DRT_E_FORKED. */
int32_t drt_writer_open(drt_runtime *runtime, const char *base_dir, uint64_t base_dir_len,
                        const char *name, uint64_t name_len,
                        const drt_writer_options *options, drt_writer **out);

/* Sets the metadata schema; must be called exactly once, before the first append.
 * fields: field_count entries sorted by name in byte order, no duplicates; borrowed
 * for the duration of the call. field_count may be 0.
 * Returns DRT_E_INVALID_ARGUMENT. */
int32_t drt_writer_set_schema(drt_writer *writer, const drt_field *fields, uint64_t field_count);

/* Appends `count` samples. Sample i's payload is payloads[payload_offsets[i] ..
 * payload_offsets[i+1]] (count + 1 offsets); columns holds one drt_column per schema
 * field, in schema order, each of `count` rows. All buffers are borrowed for the
 * duration of the call (they are copied). Records are encoded and compressed on the
 * runtime's workers and appended in order; the call returns once the batch is queued,
 * waiting first while more than max(prefetch_size, batch) earlier samples are still in
 * the pipeline. Uncompressed batches whose payloads average 64 KiB or more are instead
 * written on the calling thread, straight from `payloads` (hashed as written, not
 * copied), after the earlier batches; the call returns once they are written.
 * A failure of an earlier batch is returned by a later append or by finish.
 * Returns DRT_E_INVALID_ARGUMENT (e.g. "metadata field 'k' must be a finite float",
 * invalid UTF-8), DRT_E_IO, DRT_E_OUT_OF_MEMORY. After a failure the writer can only
 * be closed. */
int32_t drt_writer_append(drt_writer *writer, uint64_t count, const uint8_t *payloads,
                          const uint64_t *payload_offsets, const drt_column *columns);

/* Copies the stage timings (DRT_STAGE_COUNT entries) into out; all zero unless the writer
 * was opened with DRT_WRITER_PROFILE. Valid at any time, also after a failure; waits until
 * the samples appended so far are written, so they count every append. */
int32_t drt_writer_stats(drt_writer *writer, drt_stage_stats *out);

/* Number of samples appended so far (waits until the appended samples are written, as
 * drt_writer_stats does). */
int32_t drt_writer_sample_count(drt_writer *writer, uint64_t *out);

/* The staging directory (absolute or as given, no trailing slash). Without
 * DRT_WRITER_METADATA the caller writes `metadata.arrow` there before
 * drt_writer_finish(). The string is owned by the writer and valid until
 * drt_writer_close(). */
int32_t drt_writer_staging_path(drt_writer *writer, drt_str *out);

/* Completes the cache: flushes the last shard, writes metadata.arrow from the appended
 * columns (DRT_WRITER_METADATA) or checks the caller's (a readable Arrow IPC file of one
 * row per sample whose columns are the schema's fields, names and types in order,
 * without nulls; since ABI 1.15: "metadata.arrow has 4 rows, the cache 5 samples:
 * <path>", or the reader's Arrow error naming the file), writes index.bin and
 * manifest.json, fsyncs every file and directory, and renames the staging directory to
 * `<base>/<name>` without replacing anything. Fails with "cache source yielded no
 * samples" when nothing was appended. On success the writer holds nothing on disk;
 * close it next. Returns DRT_E_INVALID_ARGUMENT, DRT_E_INVALID_CACHE, DRT_E_ARROW,
 * DRT_E_EXISTS, DRT_E_IO, DRT_E_OUT_OF_MEMORY. */
int32_t drt_writer_finish(drt_writer *writer);

/* Releases the writer. If drt_writer_finish() did not succeed, removes the staging
 * directory: a failed write never publishes anything. */
void drt_writer_close(drt_writer *writer);

/* Removes the staging directories under `<base_dir>/tmp/` whose writer is gone (their
 * flock is free), e.g. after a writer process was killed. Writers in progress, in this
 * or any other process, are not touched. drt_writer_open does this too. Succeeds when
 * there is no staging area. Returns DRT_E_INVALID_ARGUMENT, DRT_E_IO. Thread-safe. */
int32_t drt_staging_sweep(const char *base_dir, uint64_t base_dir_len);

/* ---------------------------------------------------------------- dataset */

typedef struct drt_dataset_options {
    uint64_t seed;
    uint64_t prefetch_size;  /* > 0; records in flight or buffered per iterator */
    int32_t shuffle;         /* 0: ordered windows; 1: weighted draws with replacement */
    int32_t validate_cache;  /* 1: verify every SHA-256 at open, compare records with metadata;
                              * 2 (ABI 1.16; 1.17 for caches on object storage): as 1, and
                              * the error of a damaged cache names every damaged file, one
                              * per line (see drt_dataset_open) */
    int32_t io_backend;      /* DRT_IO_* */
    int32_t sampling;        /* DRT_SAMPLING_* (with shuffle only) */
} drt_dataset_options;

/* Shuffled sampling modes. */
enum {
    DRT_SAMPLING_WITH_REPLACEMENT = 0, /* dataset-rt 0.4.8: weighted draws with replacement */
    DRT_SAMPLING_PERMUTATION = 1       /* passes over the active rows, each a seeded permutation */
};

/* Facts about one cache of a dataset. */
typedef struct drt_cache_info {
    uint64_t cache_id;
    uint64_t sample_count;
    uint64_t shard_count;
    uint32_t format_version; /* 2 or 3 */
    int32_t compression;     /* DRT_COMPRESSION_* of the first shard */
    double compression_ratio;
    drt_str source_name;     /* valid while the dataset is open */
    drt_str path;            /* as given to drt_dataset_open; valid while open */
    drt_str fingerprint;     /* the manifest's "fingerprint" or {NULL, 0} (ABI 1.1) */
} drt_cache_info;

/* Opens the caches at paths[0..path_count) (in that order) as one dataset and checks
 * their structure: manifests, versions, unique cache ids, equal schemas, exact shard
 * sizes, index shape and shard ids. With validate_cache, also verifies the SHA-256 of
 * every file and checks metadata.arrow (row count, column kinds), and every record read
 * later is compared with its metadata.arrow row. Without it, metadata.arrow is read only
 * when a record holds a JSON null (how dataset-rt 0.4.8 stores NaN and infinite floats:
 * the value is taken from metadata.arrow). The active table starts as every physical
 * sample in path order.
 * paths are borrowed for the call.
 * The validated checks go: metadata.arrow (present, SHA-256), index.bin, then each shard's
 * size and SHA-256 in order (dataset-rt 0.4.8's order: the first damaged file is named).
 * With validate_cache = 2 they go on past a damaged file: one damaged file fails as
 * with 1; several fail with DRT_E_INVALID_CACHE and a message naming each on a line of
 * its own, in that order, as each alone would be named ("checksum mismatch for <file>",
 * "shard length mismatch for <file>", an I/O error), with a last line "... and N more
 * damaged files" past the message's bound (2 KiB). A remote cache's shards are verified
 * as they are fetched; with validate_cache = 2 (ABI 1.17) every shard is fetched and
 * verified at open, and an object missing on the server counts as a damaged file (a
 * failure of the store or of this machine stops the checks).
 * Returns DRT_E_INVALID_ARGUMENT, DRT_E_INVALID_CACHE ("missing manifest: <p>",
 * "checksum mismatch for <file>", ...), DRT_E_JSON, DRT_E_IO, DRT_E_OUT_OF_MEMORY. */
int32_t drt_dataset_open(drt_runtime *runtime, const drt_str *paths, uint64_t path_count,
                         const drt_dataset_options *options, drt_dataset **out);

/* Releases the caller's reference; iterators and lookups keep the dataset alive. */
void drt_dataset_close(drt_dataset *dataset);

/* ---- Caches on object storage (ABI 1.5) ------------------------------------------------
 * The embedder supplies the transport as a table of callbacks; the core does the rest:
 * it fetches a cache's manifest.json, index.bin and metadata.arrow into
 * <cache_dir>/caches/<sha256 of the manifest>/ (verified against the manifest's SHA-256
 * before they appear), and each shard, when first read, into the shard cache
 * <cache_dir>/shards/<sha256>.bin (size and SHA-256 verified; temporary file + rename;
 * least recently used shards evicted beyond budget_bytes; several processes may share
 * cache_dir). (ABI 1.8) Lookups of a shard that is not in the shard cache, and shuffled
 * iterators over a cache larger than budget_bytes, read records by byte ranges instead
 * (size, pinned version and record framing checked; see docs/c-api.md). Callbacks may be called from any thread, concurrently. A callback that does
 * not return DRT_REMOTE_OK may write a NUL-terminated explanation into message
 * (message_cap bytes); DRT_REMOTE_RETRY is retried `retries` times with exponential
 * backoff (100 ms, doubling, at most 2 s), the others fail at once. */
enum {
    DRT_REMOTE_OK = 0,
    DRT_REMOTE_NOT_FOUND = 1, /* no object at that URL (HTTP 404) */
    DRT_REMOTE_DENIED = 2,    /* credentials missing or refused (HTTP 401/403) */
    DRT_REMOTE_RETRY = 3,     /* transient: connection refused or reset, timeout, 5xx, short body */
    DRT_REMOTE_FAILED = 4,    /* anything else; not retried */
    DRT_REMOTE_CHANGED = 5    /* (ABI 1.8) a read of a handle whose object was replaced since
                                 open (HTTP 412 on a read conditional on the ETag seen at
                                 open); not retried */
};

typedef struct drt_remote_ops {
    void *context;
    /* Opens the object at url: its size in *size, a handle for read and close. The
     * handle should pin the version seen now (its ETag or version id): reads of it are
     * conditional on that version and return DRT_REMOTE_CHANGED once it was replaced
     * (ABI 1.8; a transport that does not pin still works, with only size checks). */
    int32_t (*open)(void *context, const char *url, uint64_t *size, void **handle,
                    char *message, uint64_t message_cap);
    /* Reads exactly len bytes at offset of the object into buf. */
    int32_t (*read)(void *context, void *handle, uint64_t offset, uint8_t *buf, uint64_t len,
                    char *message, uint64_t message_cap);
    void (*close)(void *context, void *handle);
} drt_remote_ops;

typedef struct drt_remote_options {
    drt_remote_ops ops;     /* copied; context must outlive the remote, its datasets and its
                               fetches ahead (see drt_remote_set_release) */
    drt_str cache_dir;      /* local directory (created): caches/ and shards/ */
    uint64_t budget_bytes;  /* > 0: bytes of shard files kept in <cache_dir>/shards */
    uint32_t retries;       /* further attempts after DRT_REMOTE_RETRY */
    uint32_t reserved;      /* 0 */
} drt_remote_options;

typedef struct drt_remote drt_remote;

/* A transport and its local directory. Thread-safe; datasets keep it alive. */
int32_t drt_remote_open(const drt_remote_options *options, drt_remote **out);
void drt_remote_close(drt_remote *remote);

/* (ABI 1.10) Optional: writes exactly len bytes at offset of the object into the file fd at
 * the same offset (positional writes: several threads write ranges of one file at once), of
 * the version open pinned; same return codes and message as read. */
typedef int32_t (*drt_remote_read_file_fn)(void *context, void *handle, uint64_t offset,
                                           uint64_t len, int32_t fd, char *message,
                                           uint64_t message_cap);

/* (ABI 1.10) Downloads of whole files (shards, index.bin, metadata.arrow) are written by
 * read_file from now on (NULL: read into a shared mapping of the file, the default). Where
 * the file system caches written files in large folios, files written with write/pwrite
 * cost the reader's later mappings far less kernel work than files written through a
 * mapping (4 KiB pages). Call it right after drt_remote_open; downloads already running
 * keep their way. */
int32_t drt_remote_set_read_file(drt_remote *remote, drt_remote_read_file_fn read_file);

/* (ABI 1.18) Optional: release(context) is called once, on the thread that drops the last
 * reference to the remote (drt_remote_close, the close of its last dataset, or the end of
 * its last fetch ahead), after the remote is freed; no callback of ops is made after it, so
 * context may be freed there (NULL: nothing is called). */
typedef void (*drt_remote_release_fn)(void *context);
int32_t drt_remote_set_release(drt_remote *remote, drt_remote_release_fn release);

/* drt_dataset_open, where every path that is a URL (scheme://...) is a cache on object
 * storage reached through remote (NULL: every path is local). Besides drt_dataset_open's
 * errors: DRT_E_INVALID_CACHE "no cache at <url>: ..." (no manifest.json there),
 * "checksum mismatch for <url>: ...", "<url> is N bytes but the manifest says M: ...",
 * "<url> changed on the server while it was read: ..." (DRT_REMOTE_CHANGED);
 * DRT_E_IO "access denied to <url>: ..." (credentials), "cannot read <url>: still failing
 * after N attempts ..." (unreachable), "cannot write the local cache ..." (disk full).
 * Shard fetch errors surface where the shard is first read (iteration, get_item).
 * validate_cache checks metadata.arrow as locally; shards fetched whole are always
 * verified, and with validate_cache every shard is fetched whole (no byte ranges). */
int32_t drt_dataset_open_remote(drt_runtime *runtime, const drt_str *paths, uint64_t path_count,
                                const drt_dataset_options *options, drt_remote *remote,
                                drt_dataset **out);

/* The local directory holding cache `index`'s manifest, index and metadata: the path
 * itself for a local cache, the fetched copy for a remote one. Valid while open. */
int32_t drt_dataset_cache_dir(drt_dataset *dataset, uint64_t index, drt_str *out);

/* Number of caches; number of schema fields; I/O backend in use (DRT_IO_URING or
 * DRT_IO_THREADS). Thread-safe. */
int32_t drt_dataset_cache_count(drt_dataset *dataset, uint64_t *out);
int32_t drt_dataset_field_count(drt_dataset *dataset, uint64_t *out);
int32_t drt_dataset_io_backend(drt_dataset *dataset, int32_t *out);

/* Read counters of a dataset since it was opened (all iterators and lookups). */
typedef struct drt_io_stats {
    uint64_t uring_reads;   /* positioned reads completed through io_uring */
    uint64_t pool_reads;    /* positioned reads run on the worker pool */
    uint64_t lookup_reads;  /* random-access reads (drt_lookup_get, calling thread) */
    uint64_t bytes_read;    /* bytes read by all of them, and by iterators from shard
                               mappings (small records in the page cache: no read) */
} drt_io_stats;

/* Copies the dataset's read counters. Thread-safe. */
int32_t drt_dataset_io_stats(drt_dataset *dataset, drt_io_stats *out);

/* 1 when this process may use io_uring (kernel support, no seccomp refusal), else 0. */
int32_t drt_io_uring_available(void);

/* Name of the SHA-256 implementation in use ("sha-ni" or "portable"). Static storage. */
const char *drt_sha256_implementation(void);

/* Facts about cache `index` (< cache_count). Strings valid while the dataset is open. */
int32_t drt_dataset_cache_info(drt_dataset *dataset, uint64_t index, drt_cache_info *out);

/* Schema field `index` (< field_count). The name is valid while the dataset is open. */
int32_t drt_dataset_field(drt_dataset *dataset, uint64_t index, drt_field *out);

/* Value types of a table column handed to drt_dataset_set_table (Arrow's). */
enum {
    DRT_TYPE_OTHER = 0, /* any type the column does not accept */
    DRT_TYPE_U64 = 1,
    DRT_TYPE_U32 = 2,
    DRT_TYPE_I64 = 3,
    DRT_TYPE_I32 = 4,
    DRT_TYPE_F64 = 5,
    DRT_TYPE_F32 = 6
};

/* One column of the active table, laid out like an Arrow array: `values` holds row_count
 * values of `type` (may be NULL for DRT_TYPE_OTHER), `validity` is an Arrow validity
 * bitmap (bit offset + i set = row i is not null; NULL = no nulls). */
typedef struct drt_table_column {
    int32_t type;     /* DRT_TYPE_* */
    uint32_t reserved; /* must be 0 */
    const void *values;
    const uint8_t *validity;
    uint64_t offset;  /* bit offset of row 0 in validity */
} drt_table_column;

/* Replaces the active table with row_count rows (>= 1) identified by (cache_ids[i],
 * sample_ids[i]) and weighted by weights[i]. Validates everything first, in the
 * reference's order: one pass over the rows (cache_id null / integer type / non-negative,
 * sample_id likewise, weight null / numeric type, identity known; the first failing row
 * wins), then weights positive and finite. Only then swaps the table, switches shuffled
 * reading to weighted draws, resets the cursor and draw counter to 0 and sets the epoch
 * length to row_count; on any error nothing changes. The columns are borrowed for the
 * call. Iterators already started keep their snapshot. O(row_count). Thread-safe.
 * Returns DRT_E_INVALID_ARGUMENT with the reference's messages, DRT_E_OUT_OF_MEMORY. */
int32_t drt_dataset_set_table(drt_dataset *dataset, uint64_t row_count,
                              const drt_table_column *cache_ids,
                              const drt_table_column *sample_ids,
                              const drt_table_column *weights);

/* The epoch length: samples each new iterator yields. Thread-safe. */
int32_t drt_dataset_epoch_len(drt_dataset *dataset, uint64_t *out);

/* Sets the epoch length for iterators opened from now on (>= 1). Does not move the
 * cursor or draw counter. Thread-safe. */
int32_t drt_dataset_set_epoch_len(drt_dataset *dataset, uint64_t epoch_len);

/* Sets the read-ahead byte budget of iterators opened from now on (ABI 1.5): the read
 * buffers of one iterator hold at most this many bytes (or one read, when a single
 * record is larger), besides the prefetch_size bound. 0 (the default) picks a quarter of
 * the CPU's last-level cache, between 2 and 16 MiB. Samples and order do not depend on
 * it. Thread-safe. */
int32_t drt_dataset_set_prefetch_bytes(drt_dataset *dataset, uint64_t prefetch_bytes);

/* The stream state of a dataset (ABI 1.2): what the next iterator reads. */
typedef struct drt_stream {
    uint64_t position;   /* next stream position (ordered cursor or draw counter) */
    uint64_t window_end; /* end of a pending partial window; equals position when none */
} drt_stream;

/* Copies the stream state. Thread-safe. */
int32_t drt_dataset_stream(drt_dataset *dataset, drt_stream *out);

/* Moves the stream (to resume a saved run): the next iterator starts at
 * stream->position and, when stream->window_end != position, takes only
 * [position, window_end) modulo 2^64, as positions are (the rest of an interrupted
 * window; one that crosses 2^64 has window_end < position); later ones take epoch_len
 * positions as usual. Iterators already open are unaffected. Thread-safe. */
int32_t drt_dataset_set_stream(drt_dataset *dataset, const drt_stream *stream);

/* Writes the SHA-256 digest identifying the active table to out[0..32): its rows
 * (cache ids and sample ids in order) and sampling weights, or, for the table a dataset
 * opens with, its caches' ids and sample counts. Equal digests: the same stream for the
 * same seed and options. O(rows) on the first call per table, then cached. Thread-safe. */
int32_t drt_dataset_table_digest(drt_dataset *dataset, uint8_t *out);

/* ---------------------------------------------------------------- reading */

/* A batch of samples, filled by drt_iter_next_batch / drt_lookup_get. All pointers are
 * owned by the iterator or lookup and valid until its next call or close.
 * Sample i: payload = payloads[i][0 .. payload_lens[i]]; identity (cache_ids[i],
 * sample_ids[i]); metadata = row i of columns[0 .. field_count) (the record's embedded
 * JSON, parsed against the schema; with DRT_BATCH_STORED_METADATA, the cache's
 * metadata.arrow row as written, no JSON parsed). With DRT_BATCH_CONTIGUOUS, the payloads are also
 * copied into one buffer: payload i = payload_base[payload_offsets[i] ..
 * payload_offsets[i] + payload_lens[i]]; without it, payload_base and payload_offsets
 * are NULL. */
typedef struct drt_batch {
    uint64_t count;
    const uint8_t *const *payloads;
    const uint64_t *payload_lens;
    const uint8_t *payload_base;
    const uint64_t *payload_offsets;
    const uint64_t *cache_ids;
    const uint64_t *sample_ids;
    const drt_column *columns;
} drt_batch;

/* Batch flags. */
enum {
    DRT_BATCH_CONTIGUOUS = 1, /* also copy the payloads into one buffer (payload_base) */
    /* (ABI 1.6) metadata columns from each cache's metadata.arrow (row = sample id, as
     * written: never the active table) instead of parsing every record's embedded JSON.
     * Equal to the JSON's values for every cache a writer produced; a row holding an
     * Arrow null takes the JSON's value. With validate_cache the JSON is still parsed and
     * compared with the row (the errors of a call without this flag). */
    DRT_BATCH_STORED_METADATA = 2,
    /* (ABI 1.8) iterators: a contiguous batch stops taking samples once its payloads
     * reach the dataset's byte budget (prefetch_bytes; at least one sample, and at most
     * one read or one 256 KiB step of small mapped records beyond it), so a batch asked
     * for by count never holds more than about the budget, whatever the record sizes.
     * Lookups take exactly the identities asked for and ignore it. */
    DRT_BATCH_BOUNDED = 4
};

/* Opens an iterator that reserves the next epoch_len positions of the dataset's stream
 * (ordered cursor or draw counter) and snapshots the active table. Reads start at once,
 * up to prefetch_size records ahead of the consumer.
 * Returns DRT_E_FORKED, DRT_E_OUT_OF_MEMORY, DRT_E_IO. */
int32_t drt_iter_open(drt_dataset *dataset, drt_iter **out);

/* Explicit stream positions for drt_iter_open_range (ABI 1.2): sample k (< count) of the
 * iterator is stream position start + (k / block_len) * block_stride + k % block_len, or
 * start + k when block_len is 0. Positions wrap modulo 2^64 like the stream counter. */
typedef struct drt_iter_range {
    uint64_t start;
    uint64_t count;
    uint64_t block_len;    /* 0: contiguous */
    uint64_t block_stride; /* >= block_len when block_len > 0 */
} drt_iter_range;

/* Opens an iterator over the positions `range` describes (one consumer's share of a
 * stream cut into blocks), with a snapshot of the active table. The dataset's own
 * position is neither read nor moved. Otherwise like drt_iter_open.
 * Returns DRT_E_INVALID_ARGUMENT (block_stride < block_len), the statuses of
 * drt_iter_open. */
int32_t drt_iter_open_range(drt_dataset *dataset, const drt_iter_range *range, drt_iter **out);

/* Copies the positions the iterator reads (for drt_iter_open, the window it reserved:
 * block_len 0). Thread-safe with respect to other iterators. */
int32_t drt_iter_window(drt_iter *iter, drt_iter_range *out);

/* Fills *out with the next up to max_count (>= 1) samples in stream order; out->count
 * is 0 at the end of the window. Without flags, payloads point into the read buffers and
 * a batch holds at most half of prefetch_size samples and half the byte budget (at least
 * one; an iterator's first batch holds one), so reads continue
 * while the caller works on it. With DRT_BATCH_CONTIGUOUS, payloads are copied into one
 * buffer (the iterator's, handed to the dataset's next iterator on close; with
 * DRT_BATCH_STORED_METADATA, large uncompressed records are read straight into it) and
 * the batch holds max_count samples (fewer only at the end of the window or
 * before an error). When a record fails after some samples were batched, those samples
 * are returned and the failure is returned by the next call. After a failure the
 * iterator is finished (later calls return count 0).
 * Returns DRT_E_INVALID_CACHE, DRT_E_JSON, DRT_E_IO, DRT_E_OUT_OF_MEMORY, DRT_E_FORKED. */
int32_t drt_iter_next_batch(drt_iter *iter, uint64_t max_count, uint32_t flags, drt_batch *out);

/* (ABI 1.7) drt_iter_next_batch with DRT_BATCH_CONTIGUOUS (implied), the payloads placed
 * in the caller's dst[0 .. capacity) instead of the iterator's buffer: when they all fit,
 * out->payload_base == dst (each payload copied once, from the mapping or read buffer
 * straight into dst); when they do not, out->payload_base is the iterator's buffer as
 * with drt_iter_next_batch (dst's contents are then unspecified). The same samples and
 * batch boundaries as drt_iter_next_batch. dst may be NULL when capacity is 0; dst must
 * stay valid for the call only. Statuses of drt_iter_next_batch. */
int32_t drt_iter_next_batch_into(drt_iter *iter, uint64_t max_count, uint32_t flags, uint8_t *dst,
                                 uint64_t capacity, drt_batch *out);

/* (ABI 1.14) Stages a batch: lets a worker thread read the samples of a later
 * drt_iter_next_batch_into(iter, max_count, flags, dst, capacity, ...) call straight into
 * dst now, while the caller works on the batch it has, so that the call finds the payloads
 * in place and copies nothing. The staged batch is the next call's, or, with one batch
 * staged already (a whole one of the same max_count), the call after it: at most two are
 * staged. It is staged only when its samples (max_count, or those up to the end of the
 * window) are runs of small uncompressed records lying back to back in local shards whose
 * pages are in the page cache: an ordered read, without validate_cache, after the
 * iterator's first batch, with a runtime of at least two worker threads, and its records
 * take 1 MiB or more (256 KiB when every shard is among those the dataset keeps mapped
 * for this: up to 256 MiB and 1,024 shards, until the dataset is closed). Each payload is
 * copied into dst out of that mapping, or its record read whole into dst and the payload
 * moved down over its header and JSON; a record that does not split, or is no longer in
 * the page cache, is read by the call as usual: the same samples, bytes, batch
 * boundaries and errors as without staging.
 * *out_needed is the bytes dst needs (the records' whole length; 0: the batch cannot be
 * staged); nothing is staged when capacity is smaller. dst may be NULL when capacity is 0
 * (to ask for *out_needed). The batch last returned stays valid.
 * While staged, dst belongs to the library: the caller neither reads nor writes it until
 * the call that takes it returns, the iterator is closed, or a call that does not take
 * the first staged batch (another dst, max_count or call) returns: such a call drops every
 * staged batch, waiting for their reads. Returns DRT_E_INVALID_ARGUMENT (max_count 0),
 * DRT_E_OUT_OF_MEMORY, DRT_E_FORKED. */
int32_t drt_iter_stage_batch(drt_iter *iter, uint64_t max_count, uint8_t *dst, uint64_t capacity,
                             uint64_t *out_needed);

/* (ABI 1.9) Gives the iterator caller memory for the payloads of the samples it reads
 * next: appends buffers[0 .. count) (lens[i] bytes each) to its queue of buffers not yet
 * assigned, after emptying that queue when flags has DRT_PAYLOAD_BUFFERS_RESET. Samples
 * read later take the queue's first buffer, in stream order, when their payload is
 * exactly as long (an uncompressed local record of 64 KiB or more whose header and JSON
 * are in the page cache): the I/O backend reads the payload straight into the buffer
 * and the sample's payload pointer is the buffer; any other sample is read as usual and
 * leaves the queue as it is. The same samples, bytes and errors either way. While the
 * last call gave buffers and none is left, such a record is not read ahead until more
 * come (unless the iterator has nothing else in flight): the buffers given bound the
 * read-ahead. A buffer
 * must stay valid, and the caller must not touch it, until the sample holding it is
 * delivered, the queue is reset before the buffer was assigned, or the iterator is
 * closed. *out_taken is the number of buffers assigned so far over the iterator's life
 * (a caller that gave b buffers holds b - *out_taken unassigned); *out_budget is the
 * byte budget (records in caller buffers count in it). count 0 only reports (and
 * resets). Statuses: DRT_E_INVALID_ARGUMENT, DRT_E_OUT_OF_MEMORY. */
int32_t drt_iter_give_payload_buffers(drt_iter *iter, uint8_t *const *buffers,
                                      const uint64_t *lens, uint64_t count, uint32_t flags,
                                      uint64_t *out_taken, uint64_t *out_budget);

/* drt_iter_give_payload_buffers flags. */
enum {
    DRT_PAYLOAD_BUFFERS_RESET = 1 /* drop the buffers not yet assigned first */
};

/* Copies the payloads of a batch (any batch: from drt_iter_next_batch or drt_lookup_get,
 * while it is valid) back to back into dst[0 .. capacity): payload i at the sum of the
 * lengths before it, so a caller gathers a batch read without DRT_BATCH_CONTIGUOUS into
 * memory of its own with one copy (ABI 1.5). *out_len is the bytes the payloads take, set
 * even when they do not fit (nothing is copied then; DRT_E_INVALID_ARGUMENT).
 * dst may be NULL when they take 0 bytes. Thread-safe for distinct dst. */
int32_t drt_batch_copy_payloads(const drt_batch *batch, uint8_t *dst, uint64_t capacity,
                                uint64_t *out_len);

/* The leading run of a batch (any batch, while it is valid; ABI 1.13): its first
 * *out_len samples have cache id *out_cache_id and the consecutive sample ids
 * *out_first, *out_first + 1, ... (all three 0 for an empty batch). A batch that is one
 * run (*out_len == count) holds rows *out_first .. *out_first + count of that cache's
 * metadata.arrow: see drt_lookup_stored_rows. */
int32_t drt_batch_run(const drt_batch *batch, uint64_t *out_cache_id, uint64_t *out_first,
                      uint64_t *out_len);

/* Writes the Arrow string views of string column `column` of a batch (its `count`
 * rows; any batch, while it is valid) into views[0 .. 16 * count): the 16-byte
 * BinaryView layout of Arrow's Utf8View (pyarrow's string_view) type. A value of at most
 * 12 bytes is inline; a longer one is its length, its first 4 bytes, buffer index 0 and
 * its offset in column->values, which the caller passes to Arrow as the array's one
 * data buffer: *out_data_len is how many bytes of column->values the views point into
 * (0 when every value is inline: no data buffer is needed). A consumer that imports
 * views (Polars) then skips its conversion from offsets (ABI 1.12). Statuses:
 * DRT_E_INVALID_ARGUMENT (not a string column, or capacity < 16 * count: nothing
 * written; offsets that decrease), DRT_E_OVERFLOW (a value's length or a long value's offset does not fit in
 * 32 bits; use the offsets). views may be NULL when count is 0. Thread-safe for
 * distinct views. */
int32_t drt_column_string_views(const drt_column *column, uint64_t count, uint8_t *views,
                                uint64_t capacity, uint64_t *out_data_len);

/* Cancels outstanding reads and releases the iterator's buffers. */
void drt_iter_close(drt_iter *iter);

/* Opens a random-access reader for drt_lookup_get. Each lookup owns its buffers, so a
 * thread that wants random access opens its own. */
int32_t drt_lookup_open(drt_dataset *dataset, drt_lookup **out);

/* Reads `count` samples by identity into *out, in the order given. Does not move any
 * cursor. Several identities are read like an iterator's positions: each distinct
 * record once, in shard and offset order, adjacent records in one read. One bad
 * identity or unreadable record fails the whole call with the status and message that
 * a call with just the first failing identity (in the order given) returns.
 * Returns DRT_E_INDEX ("cache_id 7 is out of range", "sample_id 5 is out of
 * range for cache_id 7"), the statuses of drt_iter_next_batch. */
int32_t drt_lookup_get(drt_lookup *lookup, uint64_t count, const uint64_t *cache_ids,
                       const uint64_t *sample_ids, uint32_t flags, drt_batch *out);

/* The metadata.arrow rows of samples first .. first + count of cache cache_id as a
 * batch into *out (ABI 1.13): identities, and the metadata columns as
 * DRT_BATCH_STORED_METADATA gives them (as written; never the active table, never the
 * embedded JSON, whatever validate_cache says); every payload is empty (length 0) and no
 * record is read. The batch stops at the cache's last sample, or before the first row
 * that holds an Arrow null (a sample whose value is its record's embedded JSON: read it
 * with drt_lookup_get), so out->count may be less than count (0 when row `first` holds
 * one). A caller that builds its own view of many rows at once (Python: a Polars frame
 * that batches of consecutive samples slice, see drt_batch_run) reads them this way.
 * Valid like drt_lookup_get's batch. Returns DRT_E_INDEX, with drt_lookup_get's
 * messages, for an unknown cache_id or a sample `first` that does not exist. */
int32_t drt_lookup_stored_rows(drt_lookup *lookup, uint64_t cache_id, uint64_t first,
                               uint64_t count, drt_batch *out);

/* Reads one sample by identity, exactly as drt_lookup_get with count 1 and no flags
 * (same values, same errors), packed into caller memory dst[0 .. capacity) (ABI 1.6):
 * the uint64 size of the whole packed sample, the uint64 payload length, one 8-byte slot
 * per schema field (int64, float64 bits, bool as 0/1, or a string's byte length), all
 * little-endian and unaligned, then the payload bytes, then each string field's bytes in
 * schema order. When the size exceeds capacity only the size is written (call again
 * with a larger buffer). capacity must be at least 8. One call with few arguments and
 * no pointers to follow: for bindings where each call argument and each access to a C
 * struct costs (Python's get_item).
 * Returns DRT_E_INVALID_ARGUMENT (capacity < 8), the statuses of drt_lookup_get. */
int32_t drt_lookup_get_row(drt_lookup *lookup, uint64_t cache_id, uint64_t sample_id,
                           uint8_t *dst, uint64_t capacity);

/* (ABI 1.11) Registers dst[0 .. capacity) as the lookup's row buffer for drt_lookup_row
 * (capacity at least 8), replacing any registered before; dst NULL unregisters it. The
 * lookup borrows the memory: keep it alive and unchanged until another is registered or
 * the lookup is closed. Returns DRT_E_INVALID_ARGUMENT (capacity < 8). */
int32_t drt_lookup_set_row_buffer(drt_lookup *lookup, uint8_t *dst, uint64_t capacity);

/* (ABI 1.11) drt_lookup_get_row into the registered row buffer, with three arguments
 * (bindings pay for each argument of a call): the same bytes, the same values and errors.
 * Returns the packed size (at least 16; only it was written when it exceeds the buffer's
 * capacity: register a larger buffer and call again), or on failure a negative status
 * (drt_last_error has the message): DRT_E_INVALID_ARGUMENT when no row buffer is
 * registered, the statuses of drt_lookup_get. */
int64_t drt_lookup_row(drt_lookup *lookup, uint64_t cache_id, uint64_t sample_id);

void drt_lookup_close(drt_lookup *lookup);

/* ---- fragments */

/* A distributed job writes one *fragment* per task: an ordinary cache (drt_writer_*)
 * published under a fragments directory of the job's choice, named by a stable fragment
 * id. A retried task rewrites its fragment with DRT_WRITER_REPLACE, so one id never has
 * two copies. A *commit* then turns an ordered list of fragments into one cache
 * `<base_dir>/<name>` whose sample ids follow the list: drt_commit_open verifies the
 * fragments and stages the shards and the index, the caller writes the concatenated
 * metadata.arrow into the staging directory, and drt_commit_finish checks it, writes
 * the manifest and publishes exactly like drt_writer_finish. Fragments are only read:
 * a failed commit can be retried, and the caller removes them after a success. */
typedef struct drt_commit drt_commit;

typedef struct drt_commit_options {
    uint32_t flags;    /* DRT_COMMIT_* bits */
    uint32_t reserved; /* must be 0 */
} drt_commit_options;

/* Commit flags. */
enum {
    DRT_COMMIT_REPLACE = 1 /* publish by atomically exchanging with an existing cache at the
                              destination, as DRT_WRITER_REPLACE does */
};

/* Starts committing `fragment_count` fragments (paths of fragment directories, each
 * holding manifest.json, metadata.arrow, index.bin and shards/, borrowed for the call)
 * into `<base_dir>/<name>`, in that order. Creates base_dir and a locked staging
 * directory as drt_writer_open does, then, fragment by fragment: parses its manifest
 * (all fragments must have the first one's metadata schema and shard compression),
 * verifies the SHA-256 of its metadata.arrow, places every shard under its new number
 * (a hard link, or a copy where the file system refuses links) and verifies its size
 * and SHA-256, and appends its index.bin rows with shard ids offset after verifying the
 * file's size and SHA-256 and that every row lies inside its shard. Memory does not
 * grow with the number of samples.
 * name follows drt_writer_open's rules. fragments may be NULL only when fragment_count
 * is 0 (which fails: "no fragments to commit").
 * Returns DRT_E_INVALID_ARGUMENT (bad name, options or paths; fragments that disagree
 * on schema or compression), DRT_E_EXISTS ("cache path already exists: <base>/<name>",
 * unless DRT_COMMIT_REPLACE), DRT_E_INVALID_CACHE ("missing fragment manifest: <path>",
 * "checksum mismatch for <file>", "shard length mismatch for <file>", "index row N lies
 * outside its shards: <file>", ...), DRT_E_JSON (a fragment manifest), DRT_E_IO (naming
 * the file), DRT_E_OVERFLOW, DRT_E_OUT_OF_MEMORY. On failure nothing is left on disk.
 * The handle is used by one thread at a time. */
int32_t drt_commit_open(const char *base_dir, uint64_t base_dir_len, const char *name,
                        uint64_t name_len, const drt_str *fragments, uint64_t fragment_count,
                        const drt_commit_options *options, drt_commit **out);

/* Total number of samples of the committed fragments. */
int32_t drt_commit_sample_count(drt_commit *commit, uint64_t *out);

/* The staging directory (no trailing slash). The caller writes `metadata.arrow` there
 * (the fragments' metadata.arrow rows concatenated in fragment order, one record batch,
 * non-null columns in schema order) before drt_commit_finish(). The string is owned by
 * the commit and valid until drt_commit_close(). */
int32_t drt_commit_staging_path(drt_commit *commit, drt_str *out);

/* Completes the commit: fsyncs index.bin, checks metadata.arrow (row count equal to the
 * sample count, the schema's field names and exact Arrow types in order, no nulls),
 * hashes it, writes manifest.json (source_name = name, cache_id from the name), fsyncs
 * every file and directory and renames the staging directory to `<base_dir>/<name>`
 * without replacing anything (or exchanging with DRT_COMMIT_REPLACE), then fsyncs
 * base_dir. Returns DRT_E_INVALID_ARGUMENT (metadata.arrow does not match; finish after
 * a failure or a finish), DRT_E_INVALID_CACHE / DRT_E_ARROW (metadata.arrow is not an
 * Arrow IPC file), DRT_E_EXISTS, DRT_E_IO, DRT_E_OUT_OF_MEMORY, DRT_E_FORKED. */
int32_t drt_commit_finish(drt_commit *commit);

/* Releases the commit. If drt_commit_finish() did not succeed, removes the staging
 * directory: a failed commit never publishes anything. The fragments are not touched. */
void drt_commit_close(drt_commit *commit);

/* ------------------------------------------------------- files on disk (1.3) */

/* Checks a source name: 0 when it can name a cache (a plain path segment: not empty, not
 * "." or "..", no '/', '\\' or NUL; not the reserved "tmp"; valid UTF-8), else
 * DRT_E_INVALID_ARGUMENT with the message a write of that name fails with
 * ("CacheSource.name must not be empty", "CacheSource.name must be a plain path
 * segment", "CacheSource.name must be a non-reserved plain path segment", ...).
 * Thread-safe. */
int32_t drt_source_name_check(const char *name, uint64_t name_len);

enum {
    DRT_MIGRATE_UNCHANGED = 0,          /* already format 3 with this cache_id */
    DRT_MIGRATE_UPDATED = 1,            /* rewritten as format 3, durably */
    DRT_MIGRATE_DURABILITY_UNKNOWN = 2  /* rewritten, but the directory fsync failed */
};

/* Migrates the manifest file `manifest_path` (the resolved file: a symlink's target is
 * replaced and the symlink kept by passing the target) to format 3 with `cache_id`
 * (CachedDataset.update_manifests): a format-2 manifest is rewritten atomically (temporary
 * file in the same directory, fsync, rename, directory fsync) as `format_version`,
 * `cache_id`, the known fields in order, then unknown keys sorted, in the layout the
 * writer uses; a format-3 manifest is left byte-identical. *out = DRT_MIGRATE_*.
 * The file is parsed as at load, and its messages leave out the file name (1.4).
 * Returns DRT_E_IO ("I/O error: No such file or directory (os error 2)", ...),
 * DRT_E_JSON ("JSON error: ..."; "JSON error: unsupported format version 4"),
 * DRT_E_INVALID_CACHE ("manifest cache_id changed since dataset construction"),
 * DRT_E_INVALID_ARGUMENT. Thread-safe (callers serialize migrations of one file). */
int32_t drt_manifest_migrate(const char *manifest_path, uint64_t manifest_path_len,
                             uint64_t cache_id, int32_t *out);

/* One cache's manifest after drt_dataset_migrate_manifests (ABI 1.4). */
typedef struct drt_manifest_entry {
    drt_str path;      /* the resolved manifest file (symlinks followed); valid until the
                        * next drt_dataset_migrate_manifests on the dataset, or its close */
    uint64_t cache_id; /* the cache's id in the dataset (written into a format-2 manifest) */
    int32_t outcome;   /* DRT_MIGRATE_* */
    uint32_t reserved;
} drt_manifest_entry;

/* Migrates the manifests of every cache of `dataset` to format 3
 * (CachedDataset.update_manifests(3)), all or nothing, as dataset-rt 0.4.8 does. First
 * every cache, in dataset order, is checked against the manifest the dataset loaded:
 * `<path>/manifest.json` resolved and read (DRT_E_IO, "I/O error: No such file or
 * directory (os error 2)"), parsed as at load (DRT_E_JSON / DRT_E_INVALID_CACHE, the
 * load's messages without the file name), then DRT_E_INVALID_CACHE with "manifest was
 * downgraded since dataset construction" (format 3 at load, format 2 now), "manifest
 * cache_id changed since dataset construction", "manifest changed since dataset
 * construction" (any field, or an unknown top-level key, differs), "duplicate migration
 * target or cache_id" (the same resolved file twice). The first failure is returned and
 * no file has been written. Then each format-2 manifest is rewritten as
 * drt_manifest_migrate does (atomically; a symlink's target is replaced); one that is no
 * longer the file that was checked stops the migration with DRT_E_INVALID_CACHE
 * ("manifest changed during migration").
 * `entries` holds `entry_count` (= the cache count) elements, filled for every cache
 * done. *out_done = caches finished (entry_count on success; 0 when a check failed);
 * *out_failed = the cache whose failure the status describes (entry_count on success).
 * Returns DRT_E_INVALID_ARGUMENT (wrong entry_count), DRT_E_FORKED and the errors above.
 * Thread-safe: migrations of one dataset run one at a time. */
int32_t drt_dataset_migrate_manifests(drt_dataset *dataset, drt_manifest_entry *entries,
                                      uint64_t entry_count, uint64_t *out_done,
                                      uint64_t *out_failed);

enum {
    DRT_PUBLISH_REPLACE = 1 /* replace an existing file instead of failing with DRT_E_EXISTS */
};

/* Publishes `data` as the file `<dir>/<name>` atomically (dump_config): written to a
 * temporary file in `dir`, fsynced, renamed to `name` (never replacing an existing file
 * unless DRT_PUBLISH_REPLACE), then `dir` fsynced. *out_durable = 1, or 0 when only that
 * last fsync failed (the file is in place but might not survive a crash). `data` is read
 * during the call only. Returns DRT_E_INVALID_ARGUMENT (`name` not a plain path segment;
 * unknown flags), DRT_E_EXISTS, DRT_E_IO, DRT_E_OUT_OF_MEMORY. Thread-safe. */
int32_t drt_file_publish(const char *dir, uint64_t dir_len, const char *name, uint64_t name_len,
                         const uint8_t *data, uint64_t data_len, uint32_t flags,
                         int32_t *out_durable);

/* DRT_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* DATASET_RT_H */
