//! Reading samples: iterators (a window of the dataset's stream, read ahead through a
//! bounded prefetch pipeline) and lookups (random access by identity).
//!
//! The iterator plans stream positions (sampler → index lookup) into *slots*: one
//! positioned read each, covering one record or, in ordered mode, a run of records that
//! are adjacent in one shard. Slots are submitted to io_uring (one ring per iterator) or,
//! as the fallback, to the runtime's worker pool, which runs the read and the LZ4
//! decompression. Slots complete in any order; the consumer delivers them in plan order.
//!
//! Invariants:
//! - At most `prefetch_size` samples are planned and not yet released by the consumer
//!   (in flight, completed, or in the batch last handed out), so an iterator's memory is
//!   bounded by `prefetch_size` records plus fixed buffers. A slow consumer stops reads.
//! - A batch whose payloads stay in the slot buffers (no copy) holds at most half the
//!   prefetch window (at least one sample), so the other half stays in flight while the
//!   consumer works on the batch. A contiguous batch copies payloads into one arena and
//!   releases slots as it goes, so it may be any size the caller asks for.
//! - Batch pointers stay valid until the next call on the iterator.
//! - Closing an iterator waits for, or dequeues, every outstanding read before freeing
//!   the buffers the reads target. An error finishes the iterator; the dataset stays usable.

const std = @import("std");
const posix = std.posix;
const schema = @import("schema.zig");
const status = @import("status.zig");
const abi = @import("abi.zig");
const shard = @import("shard.zig");
const lz4 = @import("lz4.zig");
const metadata_json = @import("metadata_json.zig");
const uring = @import("io/uring.zig");
const runtime_mod = @import("runtime.zig");
const arrow = @import("arrow.zig");
const dataset_mod = @import("dataset.zig");
const Dataset = dataset_mod.Dataset;
const Loc = dataset_mod.Loc;
const Table = dataset_mod.Table;

/// Descriptors a reader keeps open at most (direct-mapped by cache and shard).
pub const open_files_max = 64;
/// Largest coalesced read in ordered mode.
pub const coalesce_bytes_max = 4 << 20;
/// Batch flag: copy payloads into one contiguous arena (`payload_base` + offsets).
pub const batch_contiguous: u32 = 1;

/// Shard descriptors of one reader, opened lazily in a small direct-mapped cache so a
/// reader holds at most `open_files_max` cached descriptors however many shards exist.
/// An entry is pinned while a read on it may be in flight and is never closed then: a
/// read whose entry is pinned by another shard gets an uncached descriptor of its own.
/// Only the consumer thread touches the cache, so pins need no atomics.
const FileCache = struct {
    entries: [open_files_max]Entry = [_]Entry{.{}} ** open_files_max,

    const Entry = struct {
        cache: u32 = 0,
        shard_id: u64 = 0,
        fd: posix.fd_t = -1,
        pins: u32 = 0,
    };

    /// A descriptor in use by one read: cached (`entry` set) or owned.
    const Handle = struct {
        fd: posix.fd_t,
        entry: ?usize,
    };

    fn acquire(fc: *FileCache, ds: *const Dataset, cache: u32, shard_id: u64) status.Error!Handle {
        const h: usize = @intCast((@as(u64, cache) *% 0x9E3779B97F4A7C15 +% shard_id) % open_files_max);
        const entry = &fc.entries[h];
        if (entry.fd >= 0 and entry.cache == cache and entry.shard_id == shard_id) {
            entry.pins += 1;
            return .{ .fd = entry.fd, .entry = h };
        }
        const fd = try ds.caches[cache].openShard(shard_id);
        if (entry.pins > 0) return .{ .fd = fd, .entry = null };
        if (entry.fd >= 0) posix.close(entry.fd);
        entry.* = .{ .cache = cache, .shard_id = shard_id, .fd = fd, .pins = 1 };
        return .{ .fd = fd, .entry = h };
    }

    fn release(fc: *FileCache, handle: Handle) void {
        if (handle.entry) |h| fc.entries[h].pins -= 1 else posix.close(handle.fd);
    }

    fn deinit(fc: *FileCache) void {
        for (&fc.entries) |*e| {
            std.debug.assert(e.pins == 0);
            if (e.fd >= 0) posix.close(e.fd);
            e.fd = -1;
        }
    }
};

/// Sets a byte list's length to `n` without initializing new bytes (a read or a
/// decompression overwrites them next). `resize` would write `undefined` (0xaa) over them
/// in safety-checked builds: a memset that showed up as 20% of large-record reads.
fn growUninit(list: *std.ArrayList(u8), gpa: std.mem.Allocator, n: usize) error{OutOfMemory}!void {
    try list.ensureTotalCapacity(gpa, n);
    list.items.len = n;
}

/// Decompresses a size-prepended LZ4 payload onto the end of `out`; returns its length.
fn appendDecompressed(out: *std.ArrayList(u8), gpa: std.mem.Allocator, stored: []const u8) status.Error!u64 {
    const raw_len = lz4.prependedSize(stored) catch |err|
        return status.fail(error.InvalidCache, "failed to decompress lz4 payload: {s}", .{lz4.describe(err)});
    // An LZ4 block expands at most ~255x; a larger size prefix is corrupt, and must not
    // size an allocation.
    if (raw_len > 255 * @as(u64, stored.len) + 64) {
        return status.fail(error.InvalidCache, "failed to decompress lz4 payload: size prefix {d} is larger than a {d}-byte block can hold", .{ raw_len, stored.len });
    }
    const at = out.items.len;
    try growUninit(out, gpa, at + raw_len);
    lz4.decompressPrepended(stored, out.items[at..][0..raw_len]) catch |err|
        return status.fail(error.InvalidCache, "failed to decompress lz4 payload: {s}", .{lz4.describe(err)});
    return raw_len;
}

/// Column storage of one batch for one schema field.
const ColumnBuffer = struct {
    bytes: std.ArrayList(u8) = .empty, // bool values or string data
    ints: std.ArrayList(i64) = .empty,
    floats: std.ArrayList(f64) = .empty,
    offsets: std.ArrayList(u64) = .empty, // strings: count + 1

    fn deinit(cb: *ColumnBuffer, gpa: std.mem.Allocator) void {
        cb.bytes.deinit(gpa);
        cb.ints.deinit(gpa);
        cb.floats.deinit(gpa);
        cb.offsets.deinit(gpa);
    }
};

/// The arrays behind one `drt_batch`.
const BatchBuffers = struct {
    payloads: std.ArrayList([*]const u8) = .empty,
    payload_lens: std.ArrayList(u64) = .empty,
    payload_offsets: std.ArrayList(u64) = .empty,
    arena: std.ArrayList(u8) = .empty,
    cache_ids: std.ArrayList(u64) = .empty,
    sample_ids: std.ArrayList(u64) = .empty,
    columns: []ColumnBuffer = &.{},
    views: []abi.Column = &.{},
    values: []schema.Value = &.{},
    scratch: std.ArrayList(u8) = .empty,

    fn init(gpa: std.mem.Allocator, field_count: usize) status.Error!BatchBuffers {
        var b: BatchBuffers = .{};
        b.columns = try gpa.alloc(ColumnBuffer, field_count);
        errdefer gpa.free(b.columns);
        @memset(b.columns, .{});
        b.views = try gpa.alloc(abi.Column, field_count);
        errdefer gpa.free(b.views);
        b.values = try gpa.alloc(schema.Value, field_count);
        return b;
    }

    fn deinit(b: *BatchBuffers, gpa: std.mem.Allocator) void {
        b.payloads.deinit(gpa);
        b.payload_lens.deinit(gpa);
        b.payload_offsets.deinit(gpa);
        b.arena.deinit(gpa);
        b.cache_ids.deinit(gpa);
        b.sample_ids.deinit(gpa);
        for (b.columns) |*c| c.deinit(gpa);
        gpa.free(b.columns);
        gpa.free(b.views);
        gpa.free(b.values);
        b.scratch.deinit(gpa);
    }

    fn reset(b: *BatchBuffers, gpa: std.mem.Allocator, fields: []const schema.Field) status.Error!void {
        b.payloads.clearRetainingCapacity();
        b.payload_lens.clearRetainingCapacity();
        b.payload_offsets.clearRetainingCapacity();
        b.arena.clearRetainingCapacity();
        b.cache_ids.clearRetainingCapacity();
        b.sample_ids.clearRetainingCapacity();
        for (b.columns, fields) |*c, f| {
            c.bytes.clearRetainingCapacity();
            c.ints.clearRetainingCapacity();
            c.floats.clearRetainingCapacity();
            c.offsets.clearRetainingCapacity();
            if (f.kind == .string) try c.offsets.append(gpa, 0);
        }
    }

    /// Appends one sample: parses its embedded JSON into the columns (resolving JSON
    /// nulls and, with validate_cache, comparing with metadata.arrow) and records its payload.
    fn add(b: *BatchBuffers, ds: *Dataset, loc: Loc, json: []const u8, payload: []const u8) status.Error!void {
        const gpa = ds.gpa;
        b.scratch.clearRetainingCapacity();
        var diag: metadata_json.Diagnostic = .{};
        metadata_json.parseRecord(json, ds.fields, b.values, &b.scratch, gpa, &diag) catch |err| switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            error.Invalid => return switch (diag.kind) {
                .json => status.fail(error.Json, "JSON error: {s}", .{diag.message()}),
                .invalid_cache => status.failText(error.InvalidCache, diag.message()),
            },
        };
        var has_null = false;
        for (b.values) |v| has_null = has_null or v == .null;
        if (has_null or ds.options.validate_cache) {
            // JSON nulls are how the reference stores NaN and infinite floats: the value
            // is in metadata.arrow. With validate_cache every record is compared with it.
            const c = &ds.caches[loc.cache];
            const md = try c.metadataFile();
            const at = md.locate(loc.sample_id);
            const columns = md.batches[at.batch].columns;
            for (b.values, 0..) |*v, fi| {
                if (v.* == .null) v.* = .{ .float = columns[fi].getFloat(at.index) };
            }
            if (ds.options.validate_cache and !matchesRow(ds.fields, b.values, columns, at.index)) {
                return status.fail(error.InvalidCache, "embedded metadata does not match metadata.arrow for sample {d}", .{loc.sample_id});
            }
        }
        for (b.values, b.columns, ds.fields) |v, *col, f| {
            switch (f.kind) {
                .bool => try col.bytes.append(gpa, @intFromBool(v.bool)),
                .int => try col.ints.append(gpa, v.int),
                .float => try col.floats.append(gpa, v.float),
                .string => {
                    try col.bytes.appendSlice(gpa, v.string);
                    try col.offsets.append(gpa, col.bytes.items.len);
                },
            }
        }
        // An empty slice's pointer is arbitrary; give empty payloads a real address.
        try b.payloads.append(gpa, if (payload.len == 0) json.ptr else payload.ptr);
        try b.payload_lens.append(gpa, payload.len);
        try b.cache_ids.append(gpa, ds.caches[loc.cache].cache_id);
        try b.sample_ids.append(gpa, loc.sample_id);
    }

    fn count(b: *const BatchBuffers) u64 {
        return b.cache_ids.items.len;
    }

    /// Copies the payloads of samples `first..` into the arena (their slots can then be
    /// released) and records their offsets.
    fn pack(b: *BatchBuffers, gpa: std.mem.Allocator, first: u64) status.Error!void {
        const start: usize = @intCast(first);
        var total: usize = 0;
        for (b.payload_lens.items[start..]) |n| total += @intCast(n);
        try b.arena.ensureUnusedCapacity(gpa, @max(total, 1)); // a real address even when all payloads are empty
        for (b.payloads.items[start..], b.payload_lens.items[start..]) |p, n| {
            try b.payload_offsets.append(gpa, b.arena.items.len);
            b.arena.appendSliceAssumeCapacity(p[0..@intCast(n)]);
        }
    }

    /// The `drt_batch` view. For a contiguous batch (all payloads packed), payload
    /// pointers are rebased onto the arena, which no longer moves.
    fn view(b: *BatchBuffers, fields: []const schema.Field, contiguous: bool) abi.Batch {
        for (b.columns, b.views, fields) |*c, *v, f| {
            v.* = .{ .kind = @intFromEnum(f.kind), .reserved = 0, .values = null, .offsets = null };
            switch (f.kind) {
                .bool => v.values = c.bytes.items.ptr,
                .int => v.values = c.ints.items.ptr,
                .float => v.values = c.floats.items.ptr,
                .string => {
                    v.values = c.bytes.items.ptr;
                    v.offsets = c.offsets.items.ptr;
                },
            }
        }
        if (contiguous) {
            for (b.payloads.items, b.payload_offsets.items) |*p, off| p.* = b.arena.items.ptr + @as(usize, @intCast(off));
        }
        return .{
            .count = b.count(),
            .payloads = b.payloads.items.ptr,
            .payload_lens = b.payload_lens.items.ptr,
            .payload_base = if (contiguous) b.arena.items.ptr else null,
            .payload_offsets = if (contiguous) b.payload_offsets.items.ptr else null,
            .cache_ids = b.cache_ids.items.ptr,
            .sample_ids = b.sample_ids.items.ptr,
            .columns = b.views.ptr,
        };
    }
};

fn matchesRow(fields: []const schema.Field, values: []const schema.Value, columns: []const arrow.Column, row: u64) bool {
    for (fields, values, columns[0..fields.len]) |f, v, col| {
        if (col.isNull(row)) return false;
        const same = switch (f.kind) {
            .bool => col.getBool(row) == v.bool,
            .int => col.getInt(row) == v.int,
            .float => @as(u64, @bitCast(col.getFloat(row))) == @as(u64, @bitCast(v.float)),
            .string => std.mem.eql(u8, col.getString(row), v.string),
        };
        if (!same) return false;
    }
    return true;
}

/// Where one record's parts are after its slot is read and decoded.
const Decoded = struct {
    json_at: u32,
    json_len: u32,
    /// Payload location: in `Slot.buf` or, for lz4, in `Slot.raw`.
    payload_at: u64,
    payload_len: u64,
    in_raw: bool,
};

/// One positioned read: `count` consecutive planned samples whose records are adjacent.
const Slot = struct {
    job: runtime_mod.Job = .{ .run = runJob },
    it: *Iter = undefined,
    state: std.atomic.Value(State) = .init(.idle),
    /// Window index of the first sample and number of samples.
    first: u64 = 0,
    count: u32 = 0,
    cache: u32 = 0,
    shard_id: u64 = 0,
    offset: u64 = 0,
    len: u64 = 0,
    /// Bytes read so far (io_uring short reads are resubmitted for the rest).
    done_bytes: u64 = 0,
    fd: posix.fd_t = -1,
    file: ?FileCache.Handle = null,
    buf: std.ArrayList(u8) = .empty,
    raw: std.ArrayList(u8) = .empty,
    decoded: std.ArrayList(Decoded) = .empty,
    failure: ?status.Error = null,
    message: [256]u8 = undefined,
    message_len: usize = 0,

    const State = enum(u8) { idle, pending, done };

    fn deinit(s: *Slot, gpa: std.mem.Allocator) void {
        s.buf.deinit(gpa);
        s.raw.deinit(gpa);
        s.decoded.deinit(gpa);
    }

    /// Remembers the failure (this runs on a worker; the consumer re-raises it in order).
    fn fail(s: *Slot, err: status.Error) void {
        const msg = status.lastMessage();
        const n = @min(msg.len, s.message.len);
        @memcpy(s.message[0..n], msg[0..n]);
        s.message_len = n;
        s.failure = err;
    }

    fn runJob(job: *runtime_mod.Job) void {
        const s: *Slot = @fieldParentPtr("job", job);
        const it = s.it;
        s.readAll() catch |err| s.fail(err);
        if (s.failure == null) it.ds.countRead(.pool, s.len);
        if (s.failure == null) s.decode(it.ds) catch |err| s.fail(err);
        it.mutex.lock();
        s.state.store(.done, .release);
        it.cond.broadcast();
        it.mutex.unlock();
    }

    fn path(s: *const Slot, ds: *const Dataset) [:0]const u8 {
        return ds.caches[s.cache].shard_paths[@intCast(s.shard_id)];
    }

    fn readAll(s: *Slot) status.Error!void {
        const ds = s.it.ds;
        while (s.done_bytes < s.len) {
            const n = posix.pread(s.fd, s.buf.items[@intCast(s.done_bytes)..], s.offset + s.done_bytes) catch |err| return status.failIo(err, s.path(ds));
            if (n == 0) return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{s.path(ds)});
            s.done_bytes += n;
        }
    }

    /// Splits the records read and decompresses lz4 payloads into `raw`.
    fn decode(s: *Slot, ds: *Dataset) status.Error!void {
        const gpa = ds.gpa;
        const c = &ds.caches[s.cache];
        const compression = c.manifest.shards[@intCast(s.shard_id)].compression;
        s.decoded.clearRetainingCapacity();
        s.raw.clearRetainingCapacity();
        var at: u64 = 0;
        var k: u32 = 0;
        while (k < s.count) : (k += 1) {
            const loc = s.it.locAt(s.first + k);
            const row = c.row(loc.sample_id);
            const image = s.buf.items[@intCast(at)..@intCast(at + row.byte_len)];
            const record = try shard.split(image);
            var d: Decoded = .{
                .json_at = @intCast(at + shard.header_bytes),
                .json_len = @intCast(record.json.len),
                .payload_at = at + record.payload_offset,
                .payload_len = record.stored_payload.len,
                .in_raw = false,
            };
            if (compression == .lz4) {
                d.payload_at = s.raw.items.len;
                d.payload_len = try appendDecompressed(&s.raw, gpa, record.stored_payload);
                d.in_raw = true;
            }
            try s.decoded.append(gpa, d);
            at += row.byte_len;
        }
    }
};

pub const Backend = enum { io_uring, threads };

/// Which stream positions an iterator reads: window index k (< count) maps to
/// `start + (k / block_len) * block_stride + k % block_len`; block_len 0 means contiguous
/// (`start + k`). Blocks of `block_len` positions every `block_stride` let one consumer of
/// several read its share of a global stream (batch b of every `stride / len`-th).
pub const Schedule = struct {
    start: u64,
    count: u64,
    block_len: u64 = 0,
    block_stride: u64 = 0,

    pub fn position(s: Schedule, k: u64) u64 {
        if (s.block_len == 0) return s.start +% k;
        return s.start +% (k / s.block_len) *% s.block_stride +% (k % s.block_len);
    }

    pub fn validate(s: Schedule) status.Error!void {
        if (s.block_len != 0 and s.block_stride < s.block_len) {
            return status.fail(error.InvalidArgument, "block_stride {d} is smaller than block_len {d}", .{ s.block_stride, s.block_len });
        }
    }
};

test "schedule positions" {
    const contiguous: Schedule = .{ .start = 10, .count = 5 };
    try std.testing.expectEqual(@as(u64, 14), contiguous.position(4));
    // Batches of 2 of every third batch, starting at batch 1: 2 3 | 8 9 | 14 15.
    const strided: Schedule = .{ .start = 2, .count = 6, .block_len = 2, .block_stride = 6 };
    const want = [_]u64{ 2, 3, 8, 9, 14, 15 };
    for (want, 0..) |w, k| try std.testing.expectEqual(w, strided.position(k));
    // A stride equal to the block length is contiguous.
    const same: Schedule = .{ .start = 7, .count = 9, .block_len = 3, .block_stride = 3 };
    for (0..9) |k| try std.testing.expectEqual(7 + @as(u64, k), same.position(k));
    // Positions wrap like the stream counter does.
    const wrap: Schedule = .{ .start = std.math.maxInt(u64), .count = 2 };
    try std.testing.expectEqual(@as(u64, 0), wrap.position(1));
    try std.testing.expectError(error.InvalidArgument, (Schedule{ .start = 0, .count = 1, .block_len = 4, .block_stride = 3 }).validate());
}

pub const Iter = struct {
    ds: *Dataset,
    table: *Table,
    /// The stream positions this iterator reads; `schedule.count` samples in all.
    schedule: Schedule,
    backend: Backend,
    ring: ?uring.Ring = null,
    /// Planned locations, indexed by window index modulo prefetch.
    loc_ring: []Loc,
    slots: []Slot,
    /// Slot ring: `head` is the oldest undelivered slot, `used` slots are in use.
    head: usize = 0,
    used: usize = 0,
    /// Samples of the head slot already delivered.
    head_taken: u32 = 0,
    /// Slots fully handed out by the last batch, released on the next call.
    pending_release: usize = 0,
    /// Window indexes: next to plan, next to deliver; samples the consumer still holds.
    planned: u64 = 0,
    delivered: u64 = 0,
    held_samples: u64 = 0,
    finished: bool = false,
    /// A failure met after some samples of a batch; raised by the next call.
    deferred: ?status.Error = null,
    deferred_message: [status.message_bytes_max]u8 = undefined,
    deferred_len: usize = 0,
    files: FileCache = .{},
    batch: BatchBuffers,
    mutex: std.Thread.Mutex = .{},
    cond: std.Thread.Condition = .{},

    /// An iterator over the next window of the dataset's stream (reserved now).
    pub fn open(ds: *Dataset) status.Error!*Iter {
        return openSchedule(ds, null);
    }

    /// An iterator over explicit stream positions; the dataset's own position is untouched.
    pub fn openRange(ds: *Dataset, schedule: Schedule) status.Error!*Iter {
        try schedule.validate();
        return openSchedule(ds, schedule);
    }

    /// With no schedule, reserves the dataset's next window once nothing else can fail.
    fn openSchedule(ds: *Dataset, explicit: ?Schedule) status.Error!*Iter {
        try ds.runtime.checkPid();
        const gpa = ds.gpa;
        const prefetch: usize = @intCast(@min(ds.options.prefetch_size, 1 << 16));
        var batch = try BatchBuffers.init(gpa, ds.fields.len);
        errdefer batch.deinit(gpa);
        const loc_ring = try gpa.alloc(Loc, prefetch);
        errdefer gpa.free(loc_ring);
        const slots = try gpa.alloc(Slot, prefetch);
        errdefer gpa.free(slots);
        @memset(slots, .{});
        const it = try gpa.create(Iter);
        errdefer gpa.destroy(it);
        var backend: Backend = if (ds.io_backend == abi.io_uring) .io_uring else .threads;
        var ring: ?uring.Ring = null;
        if (backend == .io_uring) {
            ring = uring.Ring.init(@intCast(prefetch)) catch blk: {
                backend = .threads;
                break :blk null;
            };
        }
        const table: *Table, const schedule: Schedule = if (explicit) |e| .{ ds.snapshotTable(), e } else blk: {
            const window = ds.reserveWindow();
            break :blk .{ window.table, .{ .start = window.start, .count = window.len } };
        };
        it.* = .{
            .ds = ds.retain(),
            .table = table,
            .schedule = schedule,
            .backend = backend,
            .ring = ring,
            .loc_ring = loc_ring,
            .slots = slots,
            .batch = batch,
        };
        for (slots) |*s| s.it = it;
        return it;
    }

    fn locAt(it: *const Iter, window_index: u64) Loc {
        return it.loc_ring[@intCast(window_index % it.loc_ring.len)];
    }

    /// Plans and submits reads until the prefetch window is full or the window ends.
    fn fill(it: *Iter) status.Error!void {
        const ds = it.ds;
        const prefetch = it.loc_ring.len;
        while (it.planned < it.schedule.count and it.used < it.slots.len and it.planned - it.delivered + it.held_samples < prefetch) {
            const loc = ds.locate(it.table, it.schedule.position(it.planned));
            const c = &ds.caches[loc.cache];
            const row = c.row(loc.sample_id);
            const slot = &it.slots[(it.head + it.used) % it.slots.len];
            slot.first = it.planned;
            slot.count = 1;
            slot.cache = loc.cache;
            slot.shard_id = row.shard_id;
            slot.offset = row.offset;
            slot.len = row.byte_len;
            it.loc_ring[@intCast(it.planned % prefetch)] = loc;
            it.planned += 1;
            // Ordered mode: extend the read over records adjacent in the same shard.
            if (!ds.options.shuffle) {
                while (it.planned < it.schedule.count and it.planned - it.delivered + it.held_samples < prefetch and slot.len < coalesce_bytes_max and slot.len <= c.manifest.shards[@intCast(row.shard_id)].byte_len -| slot.offset) {
                    const next = ds.locate(it.table, it.schedule.position(it.planned));
                    if (next.cache != loc.cache) break;
                    const r = c.row(next.sample_id);
                    if (r.shard_id != row.shard_id or r.offset != slot.offset + slot.len) break;
                    // A record reaching past its shard fails alone, after the ones before it.
                    const shard_bytes = c.manifest.shards[@intCast(row.shard_id)].byte_len;
                    if (r.byte_len > shard_bytes -| r.offset) break;
                    slot.len += r.byte_len;
                    slot.count += 1;
                    it.loc_ring[@intCast(it.planned % prefetch)] = next;
                    it.planned += 1;
                }
            }
            it.used += 1;
            slot.failure = null;
            slot.done_bytes = 0;
            slot.decoded.clearRetainingCapacity();
            // A slot that fails before I/O, or has nothing to read, completes right here;
            // its failure is raised in plan order like any other.
            const needs_read = it.prepareRead(slot) catch |err| blk: {
                slot.fail(err);
                break :blk false;
            };
            if (!needs_read) {
                slot.state.store(.done, .release);
                continue;
            }
            slot.state.store(.pending, .release);
            switch (it.backend) {
                .threads => ds.runtime.pool.submit(&slot.job),
                .io_uring => try it.queueRead((it.head + it.used - 1) % it.slots.len, slot.buf.items, slot.offset),
            }
        }
        if (it.backend == .io_uring and it.ring.?.ring.sq_ready() > 0) {
            it.ring.?.submit(0) catch |err| return status.failIo(err, "io_uring_enter");
        }
    }

    /// io_uring: queues a read for slot `index`, submitting first when the queue is full.
    fn queueRead(it: *Iter, index: usize, buf: []u8, offset: u64) status.Error!void {
        var ring = &it.ring.?;
        const fd = it.slots[index].fd;
        ring.queueRead(index, fd, buf, offset) catch {
            ring.submit(0) catch |err| return status.failIo(err, "io_uring_enter");
            ring.queueRead(index, fd, buf, offset) catch return status.fail(error.Internal, "io_uring submission queue stays full", .{});
        };
    }

    /// Checks a planned slot's range, pins its shard descriptor and sizes its buffer.
    /// Returns false when there is nothing to read (a 0-length record from a corrupt
    /// index: decoded right away, which reports it, instead of an empty read).
    fn prepareRead(it: *Iter, slot: *Slot) status.Error!bool {
        const ds = it.ds;
        const shard_len = ds.caches[slot.cache].manifest.shards[@intCast(slot.shard_id)].byte_len;
        if (slot.offset > shard_len or slot.len > shard_len - slot.offset) {
            return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{slot.path(ds)});
        }
        const handle = try it.files.acquire(ds, slot.cache, slot.shard_id);
        slot.file = handle;
        slot.fd = handle.fd;
        try growUninit(&slot.buf, ds.gpa, @intCast(slot.len));
        if (slot.len == 0) {
            try slot.decode(ds);
            return false;
        }
        return true;
    }

    /// Waits until the head slot's read (and decode) is complete.
    fn waitHead(it: *Iter) status.Error!void {
        const slot = &it.slots[it.head];
        switch (it.backend) {
            .threads => {
                if (slot.state.load(.acquire) != .done) {
                    it.mutex.lock();
                    defer it.mutex.unlock();
                    while (slot.state.load(.acquire) != .done) it.cond.wait(&it.mutex);
                }
            },
            .io_uring => {
                while (slot.state.load(.acquire) != .done) try it.reapCompletions(1);
            },
        }
    }

    /// io_uring: handles completions (waiting for at least `wait`), finishing or resubmitting reads.
    fn reapCompletions(it: *Iter, wait: u32) status.Error!void {
        var ring = &it.ring.?;
        var out: [64]uring.Completion = undefined;
        const n = ring.reap(&out, wait) catch |err| return status.failIo(err, "io_uring_enter");
        var resubmit = false;
        for (out[0..n]) |c| {
            const slot = &it.slots[@intCast(c.user_data)];
            if (c.res < 0) {
                const e: posix.E = @enumFromInt(-c.res);
                slot.fail(status.fail(error.Io, "I/O error: {s} (os error {d}): {s}", .{ @tagName(e), -c.res, slot.path(it.ds) }));
            } else if (c.res == 0) {
                slot.fail(status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{slot.path(it.ds)}));
            } else {
                slot.done_bytes += @intCast(c.res);
                if (slot.done_bytes < slot.len) {
                    try it.queueRead(@intCast(c.user_data), slot.buf.items[@intCast(slot.done_bytes)..], slot.offset + slot.done_bytes);
                    resubmit = true;
                    continue;
                }
                it.ds.countRead(.uring, slot.len);
                slot.decode(it.ds) catch |err| slot.fail(err);
            }
            slot.state.store(.done, .release);
        }
        if (resubmit) ring.submit(0) catch |err| return status.failIo(err, "io_uring_enter");
    }

    fn releaseFile(it: *Iter, slot: *Slot) void {
        if (slot.file) |handle| it.files.release(handle);
        slot.file = null;
    }

    fn addSample(it: *Iter, slot: *Slot, k: u32) status.Error!void {
        const d = slot.decoded.items[k];
        const json = slot.buf.items[d.json_at..][0..d.json_len];
        const payload_buf = if (d.in_raw) slot.raw.items else slot.buf.items;
        const payload = payload_buf[@intCast(d.payload_at)..][0..@intCast(d.payload_len)];
        try it.batch.add(it.ds, it.locAt(slot.first + k), json, payload);
    }

    fn deferFailure(it: *Iter, err: status.Error) void {
        const msg = status.lastMessage();
        const n = @min(msg.len, it.deferred_message.len);
        @memcpy(it.deferred_message[0..n], msg[0..n]);
        it.deferred_len = n;
        it.deferred = err;
    }

    /// Releases the slots fully handed out by the previous batch.
    fn releaseDelivered(it: *Iter) void {
        while (it.pending_release > 0) : (it.pending_release -= 1) {
            it.releaseFile(&it.slots[it.head]);
            it.slots[it.head].state.store(.idle, .monotonic);
            it.head = (it.head + 1) % it.slots.len;
            it.used -= 1;
        }
        it.held_samples = 0;
    }

    /// Fills `out` with the next samples (count 0 at the end). See drt_iter_next_batch.
    pub fn nextBatch(it: *Iter, max_count: u64, flags: u32, out: *abi.Batch) status.Error!void {
        const ds = it.ds;
        try ds.runtime.checkPid();
        if (max_count == 0) return status.fail(error.InvalidArgument, "max_count must be at least 1", .{});
        it.releaseDelivered();
        if (it.deferred) |err| {
            it.deferred = null;
            it.finished = true;
            return status.failText(err, it.deferred_message[0..it.deferred_len]);
        }
        if (it.finished or it.delivered >= it.schedule.count) {
            it.finished = true;
            out.* = std.mem.zeroes(abi.Batch);
            return;
        }
        errdefer it.finished = true;
        try it.batch.reset(ds.gpa, ds.fields);
        const contiguous = flags & batch_contiguous != 0;
        if (!contiguous) {
            // Payloads stay in the slots: hand out at most half the window so the other
            // half keeps reading while the caller copies this batch.
            try it.fill();
            const taken = try it.deliver(@min(max_count, @max(1, it.loc_ring.len / 2)));
            it.held_samples = taken;
        } else {
            // Payloads are copied into the batch arena, so slots are released round by
            // round and a batch may be larger than the prefetch window.
            while (it.batch.count() < max_count and it.delivered < it.schedule.count and it.deferred == null) {
                try it.fill();
                const first = it.batch.count();
                if (try it.deliver(max_count - first) == 0) break;
                try it.batch.pack(ds.gpa, first);
                it.releaseDelivered();
            }
        }
        out.* = it.batch.view(ds.fields, contiguous);
    }

    /// Appends up to `limit` samples in plan order to the batch: waits for the oldest
    /// read, then takes whatever is already complete. A failure after samples of this
    /// batch were taken is deferred to the next call (the reference delivers the samples
    /// before a corrupt one first). Returns the samples taken.
    fn deliver(it: *Iter, wanted: u64) status.Error!u64 {
        const limit = @min(wanted, it.schedule.count - it.delivered);
        var taken: u64 = 0;
        var i: usize = 0;
        while (taken < limit and i < it.used) : (i += 1) {
            const slot = &it.slots[(it.head + i) % it.slots.len];
            if (i == 0) try it.waitHead() else if (slot.state.load(.acquire) != .done) break;
            var k: u32 = if (i == 0) it.head_taken else 0;
            while (k < slot.count and taken < limit) : (k += 1) {
                // Records decoded before a slot's failure are still delivered.
                const added = if (k < slot.decoded.items.len)
                    it.addSample(slot, k)
                else
                    status.failText(slot.failure.?, slot.message[0..slot.message_len]);
                added catch |err| {
                    if (taken == 0 and it.batch.count() == 0) return err;
                    it.deferFailure(err);
                    break;
                };
                taken += 1;
            }
            if (it.deferred != null or k < slot.count) {
                // Partly delivered: once the slots before it are released it is the head.
                it.head_taken = k;
                break;
            }
            it.head_taken = 0;
            it.pending_release += 1;
        }
        it.delivered += taken;
        return taken;
    }

    /// Waits for or dequeues every outstanding read; afterwards no read targets a buffer.
    fn drain(it: *Iter) void {
        switch (it.backend) {
            .threads => for (it.slots) |*s| {
                if (s.state.load(.acquire) != .pending) continue;
                if (it.ds.runtime.pool.cancel(&s.job)) {
                    s.state.store(.idle, .monotonic);
                    continue;
                }
                it.mutex.lock();
                while (s.state.load(.acquire) == .pending) it.cond.wait(&it.mutex);
                it.mutex.unlock();
            },
            .io_uring => {
                var ring = &it.ring.?;
                while (ring.in_flight > 0) {
                    var out: [64]uring.Completion = undefined;
                    _ = ring.reap(&out, 1) catch break;
                }
            },
        }
    }

    pub fn close(it: *Iter) void {
        const ds = it.ds;
        if (ds.runtime.checkPid()) |_| {} else |_| return; // forked child: leak, never touch
        const gpa = ds.gpa;
        it.drain();
        for (it.slots) |*s| it.releaseFile(s);
        if (it.ring) |*r| r.deinit();
        it.files.deinit();
        for (it.slots) |*s| s.deinit(gpa);
        gpa.free(it.slots);
        gpa.free(it.loc_ring);
        it.batch.deinit(gpa);
        it.table.release();
        gpa.destroy(it);
        ds.release();
    }
};

/// Random access by identity, read synchronously on the calling thread.
pub const Lookup = struct {
    ds: *Dataset,
    files: FileCache = .{},
    record: std.ArrayList(u8) = .empty,
    raw: std.ArrayList(u8) = .empty,
    /// (start, len) of each sample's payload in `raw`, filled before batching so that
    /// pointers into `raw` are taken only after it stops growing.
    spans: std.ArrayList([2]u64) = .empty,
    jsons: std.ArrayList([2]u64) = .empty,
    batch: BatchBuffers,

    pub fn open(ds: *Dataset) status.Error!*Lookup {
        try ds.runtime.checkPid();
        var batch = try BatchBuffers.init(ds.gpa, ds.fields.len);
        errdefer batch.deinit(ds.gpa);
        const lk = try ds.gpa.create(Lookup);
        lk.* = .{ .ds = ds.retain(), .batch = batch };
        return lk;
    }

    pub fn get(lk: *Lookup, cache_ids: []const u64, sample_ids: []const u64, flags: u32, out: *abi.Batch) status.Error!void {
        const ds = lk.ds;
        const gpa = ds.gpa;
        try ds.runtime.checkPid();
        lk.raw.clearRetainingCapacity();
        lk.spans.clearRetainingCapacity();
        lk.jsons.clearRetainingCapacity();
        // Pass 1: read each record; keep JSON and (decompressed) payload bytes in `raw`.
        for (cache_ids, sample_ids) |cid, sid| {
            const loc = try ds.locFor(cid, sid);
            const c = &ds.caches[loc.cache];
            const row = c.row(loc.sample_id);
            const path = c.shard_paths[@intCast(row.shard_id)];
            const shard_len = c.manifest.shards[@intCast(row.shard_id)].byte_len;
            if (row.offset > shard_len or row.byte_len > shard_len - row.offset) {
                return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{path});
            }
            try growUninit(&lk.record, gpa, @intCast(row.byte_len));
            const handle = try lk.files.acquire(ds, loc.cache, row.shard_id);
            defer lk.files.release(handle);
            var done: usize = 0;
            while (done < lk.record.items.len) {
                const n = posix.pread(handle.fd, lk.record.items[done..], row.offset + done) catch |err| return status.failIo(err, path);
                if (n == 0) return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{path});
                done += n;
            }
            ds.countRead(.lookup, row.byte_len);
            const record = try shard.split(lk.record.items);
            try lk.jsons.append(gpa, .{ lk.raw.items.len, record.json.len });
            try lk.raw.appendSlice(gpa, record.json);
            const payload_at = lk.raw.items.len;
            switch (c.manifest.shards[@intCast(row.shard_id)].compression) {
                .none => try lk.raw.appendSlice(gpa, record.stored_payload),
                .lz4 => _ = try appendDecompressed(&lk.raw, gpa, record.stored_payload),
            }
            try lk.spans.append(gpa, .{ payload_at, lk.raw.items.len - payload_at });
        }
        // Pass 2: parse and batch, now that `raw` no longer moves.
        try lk.batch.reset(gpa, ds.fields);
        for (cache_ids, sample_ids, lk.jsons.items, lk.spans.items) |cid, sid, j, p| {
            const loc = try ds.locFor(cid, sid);
            const json = lk.raw.items[@intCast(j[0])..][0..@intCast(j[1])];
            const payload = lk.raw.items[@intCast(p[0])..][0..@intCast(p[1])];
            try lk.batch.add(ds, loc, json, payload);
        }
        const contiguous = flags & batch_contiguous != 0;
        if (contiguous) try lk.batch.pack(gpa, 0);
        out.* = lk.batch.view(ds.fields, contiguous);
    }

    pub fn close(lk: *Lookup) void {
        const ds = lk.ds;
        if (ds.runtime.checkPid()) |_| {} else |_| return;
        const gpa = ds.gpa;
        lk.files.deinit();
        lk.record.deinit(gpa);
        lk.raw.deinit(gpa);
        lk.spans.deinit(gpa);
        lk.jsons.deinit(gpa);
        lk.batch.deinit(gpa);
        gpa.destroy(lk);
        ds.release();
    }
};
