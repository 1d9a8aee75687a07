//! A dataset: caches opened together in path order, the active table, and the stream
//! state that iterators take windows from.
//!
//! Invariants:
//! - `caches`, `fields`, `prefix` and `ids` never change after open.
//! - The active table is immutable and reference counted; replacing it swaps a pointer
//!   under `mutex`, and iterators keep the snapshot they took on open.
//! - `position` counts stream positions (the ordered cursor or the draw counter). Every
//!   iterator reserves `[position, position + epoch_len)` on open; `set_epoch_len` does
//!   not move it and replacing the table resets it to 0.
//! - `window_end > position` means a restored, partly read window: the next iterator
//!   reserves `[position, window_end)` instead (drt_dataset_set_stream), so a resumed
//!   run continues exactly where the saved one stopped.

const std = @import("std");
const schema = @import("../format/schema.zig");
const status = @import("../base/status.zig");
const sampler = @import("sampler.zig");
const Sha256 = @import("../codec/sha256.zig").Sha256;
const Cache = @import("../store/cache.zig").Cache;
const io = @import("../io/backend.zig");
const files = @import("../io/files.zig");
const runtime_mod = @import("../base/runtime.zig");
const Runtime = runtime_mod.Runtime;

pub const Options = struct {
    seed: u64,
    prefetch_size: u64,
    shuffle: bool,
    validate_cache: bool,
    io_backend: io.Choice,
    /// Shuffled reading in permutation passes instead of draws with replacement.
    permutation: bool = false,
};

/// A physical sample: cache position in the path list and sample id within it.
pub const Loc = struct {
    cache: u32,
    sample_id: u64,
};

/// The active rows that iterators sample from. `cache`/`sample_id` empty means "every
/// physical sample in path order" (the table a dataset starts with). `weights` null
/// means the uniform draw mode of the reference (before any update_metadata).
pub const Table = struct {
    gpa: std.mem.Allocator,
    refs: std.atomic.Value(u32) = .init(1),
    len: u64,
    cache: []u32 = &.{},
    sample_id: []u64 = &.{},
    weights: ?sampler.WeightedTable = null,
    /// SHA-256 of the table's contents, computed on first request (`digest`).
    digest_mutex: std.Thread.Mutex = .{},
    digest_value: ?[32]u8 = null,

    pub fn retain(t: *Table) *Table {
        _ = t.refs.fetchAdd(1, .monotonic);
        return t;
    }

    pub fn release(t: *Table) void {
        if (t.refs.fetchSub(1, .acq_rel) != 1) return;
        const gpa = t.gpa;
        gpa.free(t.cache);
        gpa.free(t.sample_id);
        if (t.weights) |*w| w.deinit(gpa);
        gpa.destroy(t);
    }
};

pub const Dataset = struct {
    gpa: std.mem.Allocator,
    runtime: *Runtime,
    refs: std.atomic.Value(u32) = .init(1),
    options: Options,
    /// The backend iterators use (resolved from `options.io_backend` at open).
    io_kind: io.Kind,
    caches: []Cache,
    fields: []const schema.Field,
    /// prefix[i] = samples in caches before i; prefix[caches.len] = total.
    prefix: []u64,
    ids: std.AutoHashMapUnmanaged(u64, u32) = .empty,

    /// Read counters (drt_dataset_io_stats), updated with relaxed atomics: reads per
    /// iterator backend, then lookup reads.
    reads: [std.meta.fields(io.Kind).len + 1]std.atomic.Value(u64) = @splat(.init(0)),
    bytes_read: std.atomic.Value(u64) = .init(0),

    mutex: std.Thread.Mutex = .{},
    position: u64 = 0,
    window_end: u64 = 0,
    epoch_len: u64,
    table: *Table,

    pub fn open(gpa: std.mem.Allocator, rt: *Runtime, paths: []const []const u8, options: Options) status.Error!*Dataset {
        try rt.checkPid();
        if (paths.len == 0) return status.fail(error.InvalidArgument, "CachedDataset requires at least one cache path", .{});
        if (options.prefetch_size == 0) return status.fail(error.InvalidArgument, "prefetch_size must be greater than zero", .{});
        if (paths.len > std.math.maxInt(u32)) return status.fail(error.InvalidArgument, "too many cache paths", .{});

        const caches = try gpa.alloc(Cache, paths.len);
        var opened: usize = 0;
        errdefer {
            for (caches[0..opened]) |*c| c.close();
            gpa.free(caches);
        }
        var ids: std.AutoHashMapUnmanaged(u64, u32) = .empty;
        errdefer ids.deinit(gpa);
        try ids.ensureTotalCapacity(gpa, @intCast(paths.len));
        for (paths, 0..) |p, i| {
            caches[i] = try Cache.open(gpa, p, i, options.validate_cache);
            opened += 1;
            const entry = ids.getOrPutAssumeCapacity(caches[i].cache_id);
            if (entry.found_existing) return status.fail(error.InvalidCache, "duplicate cache_id {d}", .{caches[i].cache_id});
            entry.value_ptr.* = @intCast(i);
            if (i > 0 and !sameSchema(caches[0].manifest.fields, caches[i].manifest.fields)) {
                return status.fail(error.InvalidCache, "all caches must share the same metadata schema", .{});
            }
        }
        const prefix = try gpa.alloc(u64, paths.len + 1);
        errdefer gpa.free(prefix);
        prefix[0] = 0;
        for (caches, 0..) |*c, i| {
            prefix[i + 1] = std.math.add(u64, prefix[i], c.sampleCount()) catch
                return status.fail(error.Overflow, "dataset has too many samples", .{});
        }
        if (prefix[paths.len] == 0) return status.fail(error.InvalidCache, "dataset contains no physical samples", .{});

        const io_kind = try io.resolve(options.io_backend);

        const table = try gpa.create(Table);
        errdefer gpa.destroy(table);
        table.* = .{ .gpa = gpa, .len = prefix[paths.len] };

        const ds = try gpa.create(Dataset);
        ds.* = .{
            .gpa = gpa,
            .runtime = rt.retain(),
            .options = options,
            .io_kind = io_kind,
            .caches = caches,
            .fields = caches[0].manifest.fields,
            .prefix = prefix,
            .ids = ids,
            .epoch_len = prefix[paths.len],
            .table = table,
        };
        return ds;
    }

    fn sameSchema(a: []const schema.Field, b: []const schema.Field) bool {
        if (a.len != b.len) return false;
        for (a, b) |x, y| {
            if (x.kind != y.kind or !std.mem.eql(u8, x.name, y.name)) return false;
        }
        return true;
    }

    pub fn retain(ds: *Dataset) *Dataset {
        _ = ds.refs.fetchAdd(1, .monotonic);
        return ds;
    }

    pub fn release(ds: *Dataset) void {
        if (ds.refs.fetchSub(1, .acq_rel) != 1) return;
        if (ds.runtime.checkPid()) |_| {} else |_| return; // forked child: leak, never touch
        const gpa = ds.gpa;
        ds.table.release();
        for (ds.caches) |*c| c.close();
        gpa.free(ds.caches);
        gpa.free(ds.prefix);
        ds.ids.deinit(gpa);
        ds.runtime.release();
        gpa.destroy(ds);
    }

    /// Opens shard files for an I/O descriptor cache (io/files.zig).
    pub const ShardOpener = struct {
        ds: *const Dataset,

        pub fn open(o: ShardOpener, key: files.Key) status.Error!std.posix.fd_t {
            return o.ds.caches[key.cache].openShard(key.shard_id);
        }
    };

    /// Counts one read by an iterator backend (`kind`) or by a lookup (null).
    pub fn countRead(ds: *Dataset, kind: ?io.Kind, bytes: u64) void {
        const counter = if (kind) |k| @intFromEnum(k) else ds.reads.len - 1;
        _ = ds.reads[counter].fetchAdd(1, .monotonic);
        _ = ds.bytes_read.fetchAdd(bytes, .monotonic);
    }

    pub const IoStats = struct { uring_reads: u64, pool_reads: u64, lookup_reads: u64, bytes_read: u64 };

    pub fn ioStats(ds: *const Dataset) IoStats {
        return .{
            .uring_reads = ds.reads[@intFromEnum(io.Kind.io_uring)].load(.monotonic),
            .pool_reads = ds.reads[@intFromEnum(io.Kind.threads)].load(.monotonic),
            .lookup_reads = ds.reads[ds.reads.len - 1].load(.monotonic),
            .bytes_read = ds.bytes_read.load(.monotonic),
        };
    }

    pub fn total(ds: *const Dataset) u64 {
        return ds.prefix[ds.caches.len];
    }

    /// Physical sample number `flat` (< total) in path order.
    pub fn physical(ds: *const Dataset, flat: u64) Loc {
        // upperBound over prefix[1..]: the first cache whose end is beyond flat.
        var lo: usize = 0;
        var hi: usize = ds.caches.len;
        while (lo < hi) {
            const mid = lo + (hi - lo) / 2;
            if (ds.prefix[mid + 1] <= flat) lo = mid + 1 else hi = mid;
        }
        return .{ .cache = @intCast(lo), .sample_id = flat - ds.prefix[lo] };
    }

    /// The physical sample at stream position `p` of a window over `table`.
    pub fn locate(ds: *const Dataset, table: *const Table, p: u64) Loc {
        const row: u64 = if (!ds.options.shuffle)
            p % table.len
        else if (ds.options.permutation)
            sampler.Permutation.at(table.len, ds.options.seed, p)
        else if (table.weights) |*w|
            w.draw(ds.options.seed, p)
        else
            return ds.physical(sampler.uniformDraw(ds.options.seed, p, ds.total()));
        if (table.cache.len == 0) return ds.physical(row);
        return .{ .cache = table.cache[@intCast(row)], .sample_id = table.sample_id[@intCast(row)] };
    }

    /// The cache position for `cache_id`, or error.Index with the reference's message.
    pub fn cacheIndex(ds: *const Dataset, cache_id: u64) status.Error!u32 {
        return ds.ids.get(cache_id) orelse status.fail(error.Index, "cache_id {d} is out of range", .{cache_id});
    }

    pub fn locFor(ds: *const Dataset, cache_id: u64, sample_id: u64) status.Error!Loc {
        const ci = try ds.cacheIndex(cache_id);
        if (sample_id >= ds.caches[ci].sampleCount()) {
            return status.fail(error.Index, "sample_id {d} is out of range for cache_id {d}", .{ sample_id, cache_id });
        }
        return .{ .cache = ci, .sample_id = sample_id };
    }

    /// Reserves the next window: returns its start, length and a retained table snapshot.
    /// A restored partial window (`window_end > position`) is taken first.
    pub fn reserveWindow(ds: *Dataset) struct { start: u64, len: u64, table: *Table } {
        ds.mutex.lock();
        defer ds.mutex.unlock();
        const start = ds.position;
        const len = if (ds.window_end > start) ds.window_end - start else ds.epoch_len;
        ds.position +%= len;
        ds.window_end = 0;
        return .{ .start = start, .len = len, .table = ds.table.retain() };
    }

    /// A retained reference to the active table (the caller releases it).
    pub fn snapshotTable(ds: *Dataset) *Table {
        ds.mutex.lock();
        defer ds.mutex.unlock();
        return ds.table.retain();
    }

    pub const Stream = struct { position: u64, window_end: u64 };

    /// The stream state: the next position and the end of a pending partial window
    /// (`window_end == position` when there is none).
    pub fn stream(ds: *Dataset) Stream {
        ds.mutex.lock();
        defer ds.mutex.unlock();
        return .{ .position = ds.position, .window_end = @max(ds.position, ds.window_end) };
    }

    /// Moves the stream: the next iterator starts at `s.position` and, when
    /// `s.window_end > s.position`, reserves only `[position, window_end)`.
    pub fn setStream(ds: *Dataset, s: Stream) status.Error!void {
        if (s.window_end < s.position) return status.fail(error.InvalidArgument, "window_end {d} is before position {d}", .{ s.window_end, s.position });
        ds.mutex.lock();
        defer ds.mutex.unlock();
        ds.position = s.position;
        ds.window_end = s.window_end;
    }

    /// SHA-256 identifying the active table: its rows (cache ids, sample ids) in order and
    /// its sampling weights, or, for the table a dataset starts with, the caches' ids and
    /// sample counts. Equal digests mean the same stream for the same seed and options.
    /// Computed once per table (O(rows)), then cached.
    pub fn tableDigest(ds: *Dataset) [32]u8 {
        const t = ds.snapshotTable();
        defer t.release();
        t.digest_mutex.lock();
        defer t.digest_mutex.unlock();
        if (t.digest_value) |d| return d;
        var h = Sha256.init();
        h.update("dataset_rt.table.v1\x00");
        var buf: [4096 * 16]u8 = undefined;
        var n: usize = 0;
        const put = struct {
            fn word(b: []u8, at: *usize, v: u64) void {
                std.mem.writeInt(u64, b[at.*..][0..8], v, .little);
                at.* += 8;
            }
        }.word;
        put(&buf, &n, if (t.cache.len == 0) 0 else 1);
        put(&buf, &n, t.len);
        if (t.cache.len == 0) {
            for (ds.caches) |*c| {
                if (n + 16 > buf.len) {
                    h.update(buf[0..n]);
                    n = 0;
                }
                put(&buf, &n, c.cache_id);
                put(&buf, &n, c.sampleCount());
            }
        } else {
            for (t.cache, t.sample_id) |ci, sid| {
                if (n + 16 > buf.len) {
                    h.update(buf[0..n]);
                    n = 0;
                }
                put(&buf, &n, ds.caches[ci].cache_id);
                put(&buf, &n, sid);
            }
        }
        if (t.weights) |*w| {
            for (w.cumulative) |c| {
                if (n + 8 > buf.len) {
                    h.update(buf[0..n]);
                    n = 0;
                }
                put(&buf, &n, @bitCast(c));
            }
            if (n + 8 > buf.len) {
                h.update(buf[0..n]);
                n = 0;
            }
            put(&buf, &n, @bitCast(w.total));
        }
        h.update(buf[0..n]);
        const d = h.finalResult();
        t.digest_value = d;
        return d;
    }

    pub fn epochLen(ds: *Dataset) u64 {
        ds.mutex.lock();
        defer ds.mutex.unlock();
        return ds.epoch_len;
    }

    pub fn setEpochLen(ds: *Dataset, n: u64) status.Error!void {
        if (n == 0) return status.fail(error.InvalidArgument, "epoch_len must be at least 1", .{});
        ds.mutex.lock();
        defer ds.mutex.unlock();
        ds.epoch_len = n;
    }

    /// Replaces the active table (already validated): resets the stream position to 0 and
    /// the epoch length to the new row count. Takes ownership of `table`.
    pub fn replaceTable(ds: *Dataset, table: *Table) void {
        ds.mutex.lock();
        const old = ds.table;
        ds.table = table;
        ds.position = 0;
        ds.window_end = 0;
        ds.epoch_len = table.len;
        ds.mutex.unlock();
        old.release();
    }

};
