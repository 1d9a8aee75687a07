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
//! - `window_len > 0` means a restored, partly read window: the next iterator reserves
//!   `[position, position + window_len)` instead (drt_dataset_set_stream), so a resumed
//!   run continues exactly where the saved one stopped. Positions wrap modulo 2^64, and
//!   so do windows: the stream's `window_end` is `position + window_len` modulo 2^64.

const std = @import("std");
const mem_mod = @import("../base/mem.zig");
const schema = @import("../format/schema.zig");
const status = @import("../base/status.zig");
const sampler = @import("sampler.zig");
const Sha256 = @import("../codec/sha256.zig").Sha256;
const cache_mod = @import("../store/cache.zig");
const Cache = cache_mod.Cache;
const migrate = @import("../store/migrate.zig");
const io = @import("../io/backend.zig");
const files = @import("../io/files.zig");
const remote = @import("../io/remote.zig");
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
    /// With a transport, paths that are URLs (`remote.isUrl`) open as caches on object
    /// storage (the dataset takes a reference); without one every path is local.
    remote: ?*remote.Remote = null,
    /// Read-ahead byte budget per iterator (`prefetch_bytes`); 0 picks
    /// `autoPrefetchBytes()`. Read-ahead is bounded by this and by `prefetch_size`.
    prefetch_bytes: u64 = 0,
    /// With `validate_cache`: a damaged cache's error names every damaged file, not only
    /// the first (`cache.Checks.every_damaged`; a remote cache's shards are then all
    /// downloaded and verified at open).
    name_every_damaged_file: bool = false,

    /// What opening each cache checks.
    pub fn checks(o: Options) cache_mod.Checks {
        if (!o.validate_cache) return .structure;
        return if (o.name_every_damaged_file) .every_damaged else .first_damaged;
    }
};

/// The automatic read-ahead budget: a quarter of the last-level cache (read from sysfs),
/// between 2 and 16 MiB (8 MiB when sysfs does not say). Bytes read ahead stay in the CPU
/// caches until the consumer copies them out, and no iterator pins `prefetch_size`
/// large records in memory.
pub fn autoPrefetchBytes() u64 {
    const fallback: u64 = 8 << 20;
    const llc = lastLevelCacheBytes() orelse return fallback;
    return std.math.clamp(llc / 4, 2 << 20, 16 << 20);
}

/// The largest cache size cpu0 reports in /sys/devices/system/cpu/cpu0/cache/index*/size
/// ("32768K"), or null.
fn lastLevelCacheBytes() ?u64 {
    var best: ?u64 = null;
    var path_buf: [64]u8 = undefined;
    var text_buf: [32]u8 = undefined;
    for (0..8) |i| {
        const path = std.fmt.bufPrint(&path_buf, "/sys/devices/system/cpu/cpu0/cache/index{d}/size", .{i}) catch return best;
        const text = std.fs.cwd().readFile(path, &text_buf) catch continue;
        if (parseCacheSize(std.mem.trim(u8, text, " \n"))) |n| best = @max(best orelse 0, n);
    }
    return best;
}

fn parseCacheSize(text: []const u8) ?u64 {
    if (text.len == 0) return null;
    const unit: u64 = switch (text[text.len - 1]) {
        'K' => 1 << 10,
        'M' => 1 << 20,
        'G' => 1 << 30,
        '0'...'9' => 1,
        else => return null,
    };
    const digits = if (unit == 1) text else text[0 .. text.len - 1];
    const n = std.fmt.parseInt(u64, digits, 10) catch return null;
    return std.math.mul(u64, n, unit) catch null;
}

test "cache sizes parse as sysfs prints them; the automatic budget is clamped" {
    try std.testing.expectEqual(@as(?u64, 32 << 20), parseCacheSize("32768K"));
    try std.testing.expectEqual(@as(?u64, 1 << 20), parseCacheSize("1M"));
    try std.testing.expectEqual(@as(?u64, 512), parseCacheSize("512"));
    try std.testing.expectEqual(@as(?u64, null), parseCacheSize("K"));
    try std.testing.expectEqual(@as(?u64, null), parseCacheSize("12Q"));
    const auto = autoPrefetchBytes();
    try std.testing.expect(auto >= 2 << 20 and auto <= 16 << 20);
}

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
    /// `autoPrefetchBytes()`, read once at open.
    auto_prefetch_bytes: u64,
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
    window_len: u64 = 0,
    epoch_len: u64,
    table: *Table,

    /// The buffer of contiguous batches the last iterator closed with (`Iter.own_dest`),
    /// for the next one to open with, under `mutex`: an epoch's batches then land in
    /// memory already faulted in, not in fresh pages. One at most (the larger one is
    /// kept), at most about one batch of the largest the caller asked for; freed with
    /// the dataset.
    spare: []u8 = &.{},

    /// Whole shards of local caches mapped for the iterators' staged batches
    /// (`shardMapping`), until the dataset is closed.
    shard_maps: files.ShardMaps = .{},

    /// `migrateManifests` runs one at a time; the resolved paths of the last one live in
    /// `migration_arena` until the next one or close.
    migration_mutex: std.Thread.Mutex = .{},
    migration_arena: std.heap.ArenaAllocator,

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
            caches[i] = if (options.remote != null and remote.isUrl(p))
                try remote.openCache(options.remote.?, p, i, options.checks(), &rt.pool, if (options.shuffle) 0 else 2)
            else
                try Cache.open(gpa, p, i, options.checks());
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
        if (options.remote) |r| _ = r.retain();
        ds.* = .{
            .gpa = gpa,
            .runtime = rt.retain(),
            .options = options,
            .io_kind = io_kind,
            .auto_prefetch_bytes = autoPrefetchBytes(),
            .caches = caches,
            .fields = caches[0].manifest.fields,
            .prefix = prefix,
            .ids = ids,
            .epoch_len = prefix[paths.len],
            .table = table,
            .migration_arena = .init(gpa),
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

    /// `spare` (empty if none), which the caller now owns.
    pub fn takeSpare(ds: *Dataset) []u8 {
        ds.mutex.lock();
        defer ds.mutex.unlock();
        const mem = ds.spare;
        ds.spare = &.{};
        return mem;
    }

    /// Hands `mem` (from `mem_mod.allocUninit`, or empty) back as `spare`, freeing whichever of it
    /// and the current spare is smaller.
    pub fn giveSpare(ds: *Dataset, mem: []u8) void {
        var free = mem;
        {
            ds.mutex.lock();
            defer ds.mutex.unlock();
            if (mem.len > ds.spare.len) std.mem.swap([]u8, &free, &ds.spare);
        }
        mem_mod.freeUninit(ds.gpa, free);
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
        if (ds.options.remote) |r| r.release();
        gpa.free(ds.caches);
        gpa.free(ds.prefix);
        ds.ids.deinit(gpa);
        mem_mod.freeUninit(gpa, ds.spare);
        ds.shard_maps.deinit(gpa);
        ds.migration_arena.deinit();
        ds.runtime.release();
        gpa.destroy(ds);
    }

    /// update_manifests(3): migrates every cache's manifest to format 3, all or nothing
    /// (`store/migrate.zig` `migrateAll`), checking each against the manifest this
    /// dataset loaded. `entries` has one element per cache; their paths stay valid until
    /// the next call or close. See `migrate.Progress` for what an error leaves done.
    pub fn migrateManifests(ds: *Dataset, entries: []migrate.Entry, progress: *migrate.Progress) status.Error!void {
        try ds.runtime.checkPid();
        std.debug.assert(entries.len == ds.caches.len);
        for (ds.caches) |*c| if (c.url) |u| {
            return status.fail(error.InvalidArgument, "update_manifests cannot rewrite the remote cache {s}: download it, migrate the local copy and upload that as a new cache", .{u});
        };
        ds.migration_mutex.lock();
        defer ds.migration_mutex.unlock();
        _ = ds.migration_arena.reset(.retain_capacity);
        const targets = try ds.gpa.alloc(migrate.Target, ds.caches.len);
        defer ds.gpa.free(targets);
        var made: usize = 0;
        defer for (targets[0..made]) |t| ds.gpa.free(t.path);
        for (ds.caches, targets) |*c, *t| {
            const sep = if (c.path.len > 0 and c.path[c.path.len - 1] == '/') "" else "/";
            t.* = .{
                .path = try std.fmt.allocPrint(ds.gpa, "{s}{s}manifest.json", .{ c.path, sep }),
                .loaded = &c.manifest,
                .cache_id = c.cache_id,
            };
            made += 1;
        }
        return migrate.migrateAll(ds.gpa, ds.migration_arena.allocator(), targets, entries, progress);
    }

    /// Opens shard files for an I/O descriptor cache (io/files.zig).
    pub const ShardOpener = struct {
        ds: *const Dataset,

        pub fn open(o: ShardOpener, key: files.Key) status.Error!std.posix.fd_t {
            return o.ds.caches[key.cache].openShard(key.shard_id);
        }
    };

    /// The whole mapping of shard `key`, open as `fd`, that the dataset keeps
    /// (`files.ShardMaps`: made on first use, within its budget), or null: the shard is not
    /// mapped, or belongs to a remote cache (whose shard cache may delete the file: a
    /// mapping would keep its disk space until close). Thread-safe.
    pub fn shardMapping(ds: *Dataset, key: files.Key, fd: std.posix.fd_t) ?[]const u8 {
        const c = &ds.caches[key.cache];
        if (c.url != null) return null;
        return ds.shard_maps.get(ds.gpa, key, c.manifest.shards[@intCast(key.shard_id)].byte_len, fd);
    }

    /// Counts one read by an iterator backend (`kind`) or by a lookup (null).
    pub fn countRead(ds: *Dataset, kind: ?io.Kind, bytes: u64) void {
        ds.countReads(kind, 1, bytes);
    }

    /// `countRead` for `reads` reads of `bytes` in all (one pair of atomic adds).
    pub fn countReads(ds: *Dataset, kind: ?io.Kind, reads: u64, bytes: u64) void {
        const counter = if (kind) |k| @intFromEnum(k) else ds.reads.len - 1;
        _ = ds.reads[counter].fetchAdd(reads, .monotonic);
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
        std.debug.assert(lo < ds.caches.len); // flat < total
        return .{ .cache = @intCast(lo), .sample_id = flat - ds.prefix[lo] };
    }

    /// `err` from reading the record at `loc`, its message naming the record's shard
    /// file when it is the record's own fault (a framing, JSON, metadata or lz4 error;
    /// I/O errors name the file already, other errors are not about the record).
    pub fn recordError(ds: *const Dataset, loc: Loc, err: status.Error) status.Error {
        if (err != error.InvalidCache and err != error.Json) return err;
        const c = &ds.caches[loc.cache];
        // Already about the cache (replaced while open) or one of its files (metadata.arrow).
        const msg = status.lastMessage();
        if (c.isReplacedMessage(msg) or status.mentions(msg, std.mem.trimRight(u8, c.path, "/"), .under)) return err;
        if (loc.sample_id >= c.sampleCount()) return err;
        const shard_id = c.row(loc.sample_id).shard_id;
        if (shard_id >= c.shard_paths.len) return err;
        return status.nameFile(err, c.shard_paths[@intCast(shard_id)]);
    }

    /// The physical sample at stream position `p` of a window over `table`.
    pub fn locate(ds: *const Dataset, table: *const Table, p: u64) Loc {
        std.debug.assert(table.len > 0 and (table.cache.len == 0 or table.cache.len == table.len));
        const row: u64 = if (!ds.options.shuffle)
            p % table.len
        else if (ds.options.permutation)
            sampler.Permutation.at(table.len, ds.options.seed, p)
        else if (table.weights) |*w|
            w.draw(ds.options.seed, p)
        else
            return ds.physical(sampler.uniformDraw(ds.options.seed, p, ds.total()));
        if (table.cache.len == 0) return ds.physical(row);
        const loc: Loc = .{ .cache = table.cache[@intCast(row)], .sample_id = table.sample_id[@intCast(row)] };
        // table.build admitted only known identities.
        std.debug.assert(loc.cache < ds.caches.len and loc.sample_id < ds.caches[loc.cache].sampleCount());
        return loc;
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
    /// A restored partial window (`window_len > 0`) is taken first.
    pub fn reserveWindow(ds: *Dataset) struct { start: u64, len: u64, table: *Table } {
        ds.mutex.lock();
        defer ds.mutex.unlock();
        const start = ds.position;
        const len = if (ds.window_len > 0) ds.window_len else ds.epoch_len;
        std.debug.assert(len > 0); // epoch_len >= 1: set_epoch_len and tables refuse 0
        ds.position +%= len;
        ds.window_len = 0;
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
        return .{ .position = ds.position, .window_end = ds.position +% ds.window_len };
    }

    /// Moves the stream: the next iterator starts at `s.position` and, when
    /// `s.window_end != s.position`, reserves only `[position, window_end)`, modulo 2^64
    /// as positions are (a window that crosses 2^64 ends below its start).
    pub fn setStream(ds: *Dataset, s: Stream) void {
        ds.mutex.lock();
        defer ds.mutex.unlock();
        ds.position = s.position;
        ds.window_len = s.window_end -% s.position;
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

    /// The read-ahead byte budget of iterators opened from now on (0: automatic).
    pub fn setPrefetchBytes(ds: *Dataset, n: u64) void {
        ds.mutex.lock();
        defer ds.mutex.unlock();
        ds.options.prefetch_bytes = n;
    }

    /// The byte budget an iterator opened now gets (`auto_prefetch_bytes` for 0).
    pub fn prefetchBytes(ds: *Dataset) u64 {
        ds.mutex.lock();
        const n = ds.options.prefetch_bytes;
        ds.mutex.unlock();
        return if (n == 0) ds.auto_prefetch_bytes else n;
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
        std.debug.assert(table.len > 0 and table.cache.len == table.len and table.sample_id.len == table.len);
        ds.mutex.lock();
        const old = ds.table;
        ds.table = table;
        ds.position = 0;
        ds.window_len = 0;
        ds.epoch_len = table.len;
        ds.mutex.unlock();
        old.release();
    }
};

// ---------------------------------------------------------------- tests

const testing = std.testing;
const helpers = @import("testing.zig");
const table_mod = @import("table.zig");

/// A table of explicit rows (cache position, sample id), unweighted; owned by the caller
/// until handed to `replaceTable`.
fn rowsTable(gpa: std.mem.Allocator, rows: []const Loc) !*Table {
    const t = try gpa.create(Table);
    errdefer gpa.destroy(t);
    const cache = try gpa.alloc(u32, rows.len);
    errdefer gpa.free(cache);
    const sample_id = try gpa.alloc(u64, rows.len);
    for (rows, cache, sample_id) |r, *c, *s| {
        c.* = r.cache;
        s.* = r.sample_id;
    }
    t.* = .{ .gpa = gpa, .len = rows.len, .cache = cache, .sample_id = sample_id };
    return t;
}

test "dataset: several caches: prefix sums, physical samples, ordered locate" {
    var env = try helpers.Env.openFixtures(testing.allocator, &.{ "plain_one_shard", "plain_many_shards", "unicode_é_name" }, .{});
    defer env.close();
    const ds = env.ds;
    try testing.expectEqualSlices(u64, &.{ 0, 120, 420, 430 }, ds.prefix);
    try testing.expectEqual(@as(u64, 430), ds.total());
    try testing.expectEqual(@as(u64, 430), ds.epochLen());
    try helpers.expectFields(&helpers.fixture_fields, ds.fields);
    for (0..430) |flat| try testing.expectEqual(env.pathOrder(flat), ds.physical(flat));
    for (env.cache_ids, 0..) |id, i| {
        try testing.expectEqual(@as(u32, @intCast(i)), try ds.cacheIndex(id));
        try testing.expectEqual(Loc{ .cache = @intCast(i), .sample_id = 7 }, try ds.locFor(id, 7));
    }
    // Ordered: stream position p is physical sample p mod total, epoch after epoch.
    for ([_]u64{ 0, 119, 120, 419, 420, 429, 430, 431, 5 * 430 + 125, std.math.maxInt(u64) }) |p| {
        try testing.expectEqual(env.pathOrder(p % 430), ds.locate(ds.table, p));
    }
    // Ordered over explicit rows: row p mod len.
    const rows = [_]Loc{ .{ .cache = 2, .sample_id = 3 }, .{ .cache = 0, .sample_id = 7 }, .{ .cache = 1, .sample_id = 299 } };
    ds.replaceTable(try rowsTable(testing.allocator, &rows));
    for (0..10) |p| try testing.expectEqual(rows[p % 3], ds.locate(ds.table, p));
}

test "dataset: windows: reserveWindow sequence, set_epoch_len, a restored partial window, a new table" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{ "plain_one_shard", "unicode_é_name" }, .{ .prefetch_size = 4 });
    defer env.close();
    const ds = env.ds;
    const Window = struct { u64, u64 };
    const take = struct {
        fn window(d: *Dataset) Window {
            const w = d.reserveWindow();
            w.table.release();
            return .{ w.start, w.len };
        }
    }.window;
    try testing.expectEqual(Window{ 0, 130 }, take(ds));
    try testing.expectEqual(Window{ 130, 130 }, take(ds));
    // set_epoch_len changes later windows only; the position does not move.
    try ds.setEpochLen(7);
    try testing.expectEqual(@as(u64, 7), ds.epochLen());
    try testing.expectEqual(Dataset.Stream{ .position = 260, .window_end = 260 }, ds.stream());
    try testing.expectEqual(Window{ 260, 7 }, take(ds));
    try testing.expectEqual(Window{ 267, 7 }, take(ds));
    try testing.expectError(error.InvalidArgument, ds.setEpochLen(0));
    try testing.expectEqualStrings("epoch_len must be at least 1", status.lastMessage());
    try testing.expectEqual(@as(u64, 7), ds.epochLen());

    // A restored partial window is taken first, then whole windows again.
    ds.setStream(.{ .position = 100, .window_end = 103 });
    try testing.expectEqual(Dataset.Stream{ .position = 100, .window_end = 103 }, ds.stream());
    try testing.expectEqual(Window{ 100, 3 }, take(ds));
    try testing.expectEqual(Window{ 103, 7 }, take(ds));
    try testing.expectEqual(Dataset.Stream{ .position = 110, .window_end = 110 }, ds.stream());
    ds.setStream(.{ .position = 5, .window_end = 5 });
    try testing.expectEqual(Window{ 5, 7 }, take(ds));
    // A window that crosses 2^64 (what `stream` gives for one) ends below its start.
    const near_end = std.math.maxInt(u64) - 1;
    ds.setStream(.{ .position = near_end, .window_end = 3 });
    try testing.expectEqual(Dataset.Stream{ .position = near_end, .window_end = 3 }, ds.stream());
    try testing.expectEqual(Window{ near_end, 5 }, take(ds));
    try testing.expectEqual(Dataset.Stream{ .position = 3, .window_end = 3 }, ds.stream());
    ds.setStream(.{ .position = 12, .window_end = 12 });

    // An iterator over a restored window reads exactly its rest.
    ds.setStream(.{ .position = 125, .window_end = 128 });
    {
        const it = try env.openIter();
        defer it.close();
        const got = try env.collect(it, 2);
        defer gpa.free(got);
        try testing.expectEqualSlices(Loc, &.{ .{ .cache = 1, .sample_id = 5 }, .{ .cache = 1, .sample_id = 6 }, .{ .cache = 1, .sample_id = 7 } }, got);
    }

    // A new table resets the position and the epoch length; an iterator opened before
    // keeps its snapshot and window.
    const before = try env.openIter();
    defer before.close();
    ds.replaceTable(try rowsTable(gpa, &.{ .{ .cache = 1, .sample_id = 9 }, .{ .cache = 0, .sample_id = 0 } }));
    try testing.expectEqual(Dataset.Stream{ .position = 0, .window_end = 0 }, ds.stream());
    try testing.expectEqual(@as(u64, 2), ds.epochLen());
    try testing.expectEqual(Window{ 0, 2 }, take(ds));
    try testing.expectEqual(@as(u64, 7), try env.expectEpoch(before, 3, false));
    const after = try env.openIter();
    defer after.close();
    const got = try env.collect(after, 8);
    defer gpa.free(got);
    try testing.expectEqualSlices(Loc, &.{ .{ .cache = 1, .sample_id = 9 }, .{ .cache = 0, .sample_id = 0 } }, got);
}

test "dataset: the table digest is equal for equal tables and differs otherwise" {
    const gpa = testing.allocator;
    var a = try helpers.Env.openFixtures(gpa, &.{ "plain_one_shard", "unicode_é_name" }, .{});
    defer a.close();
    var b = try helpers.Env.openFixtures(gpa, &.{ "plain_one_shard", "unicode_é_name" }, .{ .shuffle = true, .seed = 1 });
    defer b.close();
    var c = try helpers.Env.openFixtures(gpa, &.{ "unicode_é_name", "plain_one_shard" }, .{});
    defer c.close();

    // The initial table: its caches' ids and sample counts in path order.
    var h = Sha256.init();
    h.update("dataset_rt.table.v1\x00");
    for ([_]u64{ 0, 130, a.cache_ids[0], 120, a.cache_ids[1], 10 }) |word| {
        var bytes: [8]u8 = undefined;
        std.mem.writeInt(u64, &bytes, word, .little);
        h.update(&bytes);
    }
    const initial = h.finalResult();
    try testing.expectEqual(initial, a.ds.tableDigest());
    try testing.expectEqual(initial, a.ds.tableDigest()); // cached
    try testing.expectEqual(initial, b.ds.tableDigest()); // options do not matter
    try testing.expect(!std.mem.eql(u8, &initial, &c.ds.tableDigest())); // path order does

    // Weighted tables: equal rows and weights give equal digests.
    const cids = [_]u64{ a.cache_ids[1], a.cache_ids[0], a.cache_ids[1] };
    const sids = [_]u64{ 3, 0, 9 };
    const Weights = [3]f64;
    const column = struct {
        fn of(comptime T: type, values: []const T) table_mod.Column {
            const value_type: table_mod.ValueType = switch (T) {
                u64 => .u64,
                f64 => .f64,
                else => unreachable,
            };
            return .{ .type = value_type, .values = values.ptr, .validity = null, .offset = 0 };
        }
    }.of;
    const replace = struct {
        fn with(env: *helpers.Env, c_ids: []const u64, s_ids: []const u64, weights: *const Weights) !void {
            const t = try table_mod.build(env.ds, 3, column(u64, c_ids), column(u64, s_ids), column(f64, weights));
            env.ds.replaceTable(t);
        }
    }.with;
    try replace(&a, &cids, &sids, &.{ 1.0, 2.0, 0.5 });
    try replace(&b, &cids, &sids, &.{ 1.0, 2.0, 0.5 });
    const weighted = a.ds.tableDigest();
    try testing.expect(!std.mem.eql(u8, &initial, &weighted));
    try testing.expectEqual(weighted, b.ds.tableDigest());
    try replace(&b, &cids, &sids, &.{ 1.0, 2.0, 0.25 });
    try testing.expect(!std.mem.eql(u8, &weighted, &b.ds.tableDigest()));
    try replace(&b, &cids, &.{ 3, 0, 8 }, &.{ 1.0, 2.0, 0.5 });
    try testing.expect(!std.mem.eql(u8, &weighted, &b.ds.tableDigest()));
    try replace(&b, &cids, &sids, &.{ 1.0, 2.0, 0.5 });
    try testing.expectEqual(weighted, b.ds.tableDigest());
}

test "dataset: open rejects a duplicate cache id, a schema mismatch and bad arguments without leaking" {
    const gpa = testing.allocator;
    const rt = try Runtime.open(gpa, 1);
    defer rt.release();
    const one = try helpers.fixturePath(gpa, "plain_one_shard");
    defer gpa.free(one);
    const text = try helpers.fixturePath(gpa, "text_records_v1");
    defer gpa.free(text);
    const missing = try helpers.fixturePath(gpa, "no_such_cache");
    defer gpa.free(missing);
    const options: Options = .{ .seed = 0, .prefetch_size = 4, .shuffle = false, .validate_cache = false, .io_backend = .threads };

    try testing.expectError(error.InvalidCache, Dataset.open(gpa, rt, &.{ one, text, one }, options));
    try testing.expectEqualStrings("all caches must share the same metadata schema", status.lastMessage());
    try testing.expectError(error.InvalidCache, Dataset.open(gpa, rt, &.{ one, one }, options));
    var buf: [128]u8 = undefined;
    try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "duplicate cache_id {d}", .{@import("../format/manifest.zig").cacheIdForName("plain_one_shard")}), status.lastMessage());
    try testing.expectError(error.InvalidCache, Dataset.open(gpa, rt, &.{ one, missing }, options));
    try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "missing manifest: "));
    try testing.expect(std.mem.endsWith(u8, status.lastMessage(), "no_such_cache/manifest.json"));
    try testing.expectError(error.InvalidArgument, Dataset.open(gpa, rt, &.{}, options));
    try testing.expectEqualStrings("CachedDataset requires at least one cache path", status.lastMessage());
    var no_prefetch = options;
    no_prefetch.prefetch_size = 0;
    try testing.expectError(error.InvalidArgument, Dataset.open(gpa, rt, &.{one}, no_prefetch));
    try testing.expectEqualStrings("prefetch_size must be greater than zero", status.lastMessage());
    // The runtime is still referenced once (ours): failed opens released theirs.
    try testing.expectEqual(@as(u32, 1), rt.refs.load(.monotonic));
}

test "dataset: a validated open naming every damaged file lists each, one alone as without naming them all" {
    const gpa = testing.allocator;
    const rt = try Runtime.open(gpa, 1);
    defer rt.release();
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    try helpers.copyFixture(gpa, tmp.dir, "plain_many_shards");
    const root = try tmp.dir.realpathAlloc(gpa, "plain_many_shards");
    defer gpa.free(root);
    var shards = try tmp.dir.openDir("plain_many_shards/shards", .{});
    defer shards.close();
    var options: Options = .{ .seed = 0, .prefetch_size = 4, .shuffle = false, .validate_cache = true, .io_backend = .threads };

    // One damaged file fails the same naming every damaged file or not (here an I/O
    // error, not an invalid cache).
    try shards.deleteFile("000004.bin");
    const missing = try std.fmt.allocPrint(gpa, "I/O error: No such file or directory (os error 2): {s}/shards/000004.bin", .{root});
    defer gpa.free(missing);
    for ([_]bool{ false, true }) |every| {
        options.name_every_damaged_file = every;
        try testing.expectError(error.Io, Dataset.open(gpa, rt, &.{root}, options));
        try testing.expectEqualStrings(missing, status.lastMessage());
    }

    // Several: a line each, in shard order; without naming them all, the first.
    for ([_][]const u8{ "000002.bin", "000009.bin" }) |name| {
        const file = try shards.openFile(name, .{ .mode = .read_write });
        defer file.close();
        var byte: [1]u8 = undefined;
        _ = try file.preadAll(&byte, 10);
        byte[0] ^= 1;
        try file.pwriteAll(&byte, 10);
    }
    const want = try std.fmt.allocPrint(gpa, "checksum mismatch for {s}/shards/000002.bin\n{s}\nchecksum mismatch for {s}/shards/000009.bin", .{ root, missing, root });
    defer gpa.free(want);
    options.name_every_damaged_file = true;
    try testing.expectError(error.InvalidCache, Dataset.open(gpa, rt, &.{root}, options));
    try testing.expectEqualStrings(want, status.lastMessage());
    options.name_every_damaged_file = false;
    try testing.expectError(error.InvalidCache, Dataset.open(gpa, rt, &.{root}, options));
    try testing.expectEqualStrings(want[0..std.mem.indexOfScalar(u8, want, '\n').?], status.lastMessage());
    // Without validate_cache the flag checks no checksum: only the structure fails.
    options.validate_cache = false;
    options.name_every_damaged_file = true;
    try testing.expectError(error.Io, Dataset.open(gpa, rt, &.{root}, options));
    try testing.expectEqualStrings(missing, status.lastMessage());
}
