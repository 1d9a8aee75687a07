//! The library's root: the exported C ABI (abi/exports.zig) and, under `zig build test`,
//! every file's unit tests.
//!
//! Layers, imports only downward (enforced by tests/test_native_layers.py):
//!   base/   status (errors, the thread-local message), runtime (the worker pool), mem
//!           (buffers allocated without safe builds' fill)
//!   codec/  lz4, sha256, chacha: bytes in, bytes out
//!   format/ schema, manifest, index, shard record, record JSON, Arrow IPC: the bytes on disk
//!   store/  a cache on disk: open and validate; publish (staging, lock, sweep, fsync, rename)
//!   io/     the read interface and its backends (io_uring, thread pool), the descriptor cache
//!   read/   dataset, table, sampler, plan, iterator, lookup, batch
//!   write/  writer, fragment commit
//!   abi/    the exported drt_* functions and the C types

comptime {
    _ = @import("abi/exports.zig");
}

test {
    const std = @import("std");
    std.testing.refAllDecls(@import("abi/exports.zig"));
    _ = @import("base/status.zig");
    _ = @import("base/runtime.zig");
    _ = @import("base/mem.zig");
    _ = @import("codec/lz4.zig");
    _ = @import("codec/sha256.zig");
    _ = @import("codec/chacha.zig");
    _ = @import("format/schema.zig");
    _ = @import("format/manifest.zig");
    _ = @import("format/arrow_write.zig");
    _ = @import("format/index.zig");
    _ = @import("format/shard.zig");
    _ = @import("format/metadata_json.zig");
    _ = @import("format/arrow.zig");
    _ = @import("store/cache.zig");
    _ = @import("store/publish.zig");
    _ = @import("store/migrate.zig");
    _ = @import("io/backend.zig");
    _ = @import("io/uring.zig");
    _ = @import("io/threads.zig");
    _ = @import("io/files.zig");
    _ = @import("io/shardcache.zig");
    _ = @import("io/remote.zig");
    _ = @import("read/dataset.zig");
    _ = @import("read/table.zig");
    _ = @import("read/sampler.zig");
    _ = @import("read/plan.zig");
    _ = @import("read/iterator.zig");
    _ = @import("read/lookahead.zig");
    _ = @import("read/adjacent.zig");
    _ = @import("read/lookup.zig");
    _ = @import("read/batch.zig");
    _ = @import("read/record.zig");
    _ = @import("read/testing.zig");
    _ = @import("write/writer.zig");
    _ = @import("write/fragment.zig");
    _ = @import("write/seal.zig");
    _ = @import("abi/types.zig");
}
