//! Reading samples into batches: iterators (a window of the dataset's stream) and lookups
//! (random access by identity). Both fill a `BatchBuffers` that the C ABI hands out as a
//! `drt_batch`: one payload arena with offsets, identity arrays, and one typed column per
//! schema field parsed natively from each record's embedded JSON.
//!
//! Invariants:
//! - A batch holds at most `prefetch_size` samples, so an iterator's memory is bounded by
//!   `prefetch_size` records plus fixed buffers.
//! - Records are read with positioned reads through a small per-reader file cache, so a
//!   reader holds at most `open_files_max` descriptors however many shards exist.
//! - Adjacent records of one shard that are consecutive in the plan are read with one
//!   positioned read.
//! - An error finishes the iterator; the dataset stays usable.

const std = @import("std");
const posix = std.posix;
const schema = @import("schema.zig");
const status = @import("status.zig");
const abi = @import("abi.zig");
const shard = @import("shard.zig");
const lz4 = @import("lz4.zig");
const metadata_json = @import("metadata_json.zig");
const dataset_mod = @import("dataset.zig");
const Dataset = dataset_mod.Dataset;
const Loc = dataset_mod.Loc;
const Table = dataset_mod.Table;

/// Descriptors a reader keeps open at most (direct-mapped by cache and shard).
pub const open_files_max = 16;

const FileCache = struct {
    slots: [open_files_max]Slot = [_]Slot{.{}} ** open_files_max,

    const Slot = struct {
        cache: u32 = 0,
        shard_id: u64 = 0,
        fd: posix.fd_t = -1,
    };

    fn get(fc: *FileCache, ds: *const Dataset, cache: u32, shard_id: u64) status.Error!posix.fd_t {
        const h = (@as(u64, cache) *% 0x9E3779B97F4A7C15 +% shard_id) % open_files_max;
        const slot = &fc.slots[@intCast(h)];
        if (slot.fd >= 0 and slot.cache == cache and slot.shard_id == shard_id) return slot.fd;
        if (slot.fd >= 0) posix.close(slot.fd);
        slot.fd = -1;
        const path = ds.caches[cache].shard_paths[@intCast(shard_id)];
        const fd = posix.openZ(path, .{ .ACCMODE = .RDONLY, .CLOEXEC = true }, 0) catch |err| return status.failIo(err, path);
        slot.* = .{ .cache = cache, .shard_id = shard_id, .fd = fd };
        return fd;
    }

    fn deinit(fc: *FileCache) void {
        for (&fc.slots) |*s| {
            if (s.fd >= 0) posix.close(s.fd);
            s.fd = -1;
        }
    }
};

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

pub const BatchBuffers = struct {
    arena: std.ArrayList(u8) = .empty,
    payload_offsets: std.ArrayList(u64) = .empty,
    payload_lens: std.ArrayList(u64) = .empty,
    cache_ids: std.ArrayList(u64) = .empty,
    sample_ids: std.ArrayList(u64) = .empty,
    columns: []ColumnBuffer = &.{},
    views: []abi.Column = &.{},
    values: []schema.Value = &.{},
    scratch: std.ArrayList(u8) = .empty,
    files: FileCache = .{},

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
        b.files.deinit();
        b.arena.deinit(gpa);
        b.payload_offsets.deinit(gpa);
        b.payload_lens.deinit(gpa);
        b.cache_ids.deinit(gpa);
        b.sample_ids.deinit(gpa);
        for (b.columns) |*c| c.deinit(gpa);
        gpa.free(b.columns);
        gpa.free(b.views);
        gpa.free(b.values);
        b.scratch.deinit(gpa);
    }

    fn reset(b: *BatchBuffers, gpa: std.mem.Allocator, fields: []const schema.Field) status.Error!void {
        b.arena.clearRetainingCapacity();
        b.payload_offsets.clearRetainingCapacity();
        b.payload_lens.clearRetainingCapacity();
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

    /// Reads the samples at `locs` (in order) into the buffers.
    fn fill(b: *BatchBuffers, ds: *Dataset, locs: []const Loc) status.Error!void {
        const gpa = ds.gpa;
        try b.reset(gpa, ds.fields);
        var i: usize = 0;
        while (i < locs.len) {
            // Coalesce a run of records that are adjacent in one shard.
            const first = ds.caches[locs[i].cache].row(locs[i].sample_id);
            var end = first.offset +| first.byte_len;
            var j = i + 1;
            while (j < locs.len and locs[j].cache == locs[i].cache) : (j += 1) {
                const r = ds.caches[locs[j].cache].row(locs[j].sample_id);
                if (r.shard_id != first.shard_id or r.offset != end) break;
                end = r.offset +| r.byte_len;
            }
            const run_start = b.arena.items.len;
            try b.readRange(ds, locs[i].cache, first.shard_id, first.offset, end);
            var k = i;
            while (k < j) : (k += 1) {
                const r = ds.caches[locs[k].cache].row(locs[k].sample_id);
                const at = run_start + @as(usize, @intCast(r.offset - first.offset));
                try b.decodeRecord(ds, locs[k], at, @intCast(r.byte_len));
            }
            i = j;
        }
        for (b.columns, b.views, ds.fields) |*c, *v, f| {
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
    }

    fn readRange(b: *BatchBuffers, ds: *Dataset, cache: u32, shard_id: u64, start: u64, end: u64) status.Error!void {
        const c = &ds.caches[cache];
        const path = c.shard_paths[@intCast(shard_id)];
        if (end > c.manifest.shards[@intCast(shard_id)].byte_len or end < start) {
            return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{path});
        }
        const len: usize = @intCast(end - start);
        const at = b.arena.items.len;
        try b.arena.resize(ds.gpa, at + len);
        const fd = try b.files.get(ds, cache, shard_id);
        var done: usize = 0;
        while (done < len) {
            const n = posix.pread(fd, b.arena.items[at + done .. at + len], start + done) catch |err| return status.failIo(err, path);
            if (n == 0) return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{path});
            done += n;
        }
    }

    fn decodeRecord(b: *BatchBuffers, ds: *Dataset, loc: Loc, at: usize, len: usize) status.Error!void {
        const gpa = ds.gpa;
        const c = &ds.caches[loc.cache];
        const row = c.row(loc.sample_id);
        const record = shard.split(b.arena.items[at .. at + len]) catch |err| return err;
        b.scratch.clearRetainingCapacity();
        var diag: metadata_json.Diagnostic = .{};
        metadata_json.parseRecord(record.json, ds.fields, b.values, &b.scratch, gpa, &diag) catch |err| switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            error.Invalid => return status.failText(switch (diag.kind) {
                .json => error.Json,
                .invalid_cache => error.InvalidCache,
            }, diag.message()),
        };
        const attached = ds.attachedFor(loc.cache);
        for (b.values, ds.fields, 0..) |*v, f, fi| {
            if (v.* == .null) {
                const a = attached orelse return status.fail(error.InvalidCache, "embedded metadata field '{s}' of sample {d} is null (a NaN or infinite float) and metadata.arrow is not loaded", .{ f.name, loc.sample_id });
                v.* = .{ .float = @as([*]const f64, @ptrCast(@alignCast(a.columns[fi].values.?)))[@intCast(loc.sample_id)] };
            }
        }
        if (ds.options.validate_cache) {
            const a = attached orelse return status.fail(error.Internal, "validate_cache requires attached metadata", .{});
            if (!matchesRow(ds.fields, b.values, a, loc.sample_id)) {
                return status.fail(error.InvalidCache, "embedded metadata does not match metadata.arrow for sample {d}", .{loc.sample_id});
            }
        }
        // Copy the parsed values (strings may point into the arena or scratch) into columns.
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
        const payload_at = at + record.payload_offset;
        switch (c.manifest.shards[@intCast(row.shard_id)].compression) {
            .none => {
                try b.payload_offsets.append(gpa, payload_at);
                try b.payload_lens.append(gpa, record.stored_payload.len);
            },
            .lz4 => {
                const stored = b.arena.items[payload_at .. at + len];
                const raw_len = lz4.prependedSize(stored) catch |err|
                    return status.fail(error.InvalidCache, "failed to decompress lz4 payload: {s}", .{lz4.describe(err)});
                const out_at = b.arena.items.len;
                try b.arena.resize(gpa, out_at + raw_len);
                // The arena may have moved: slice the stored bytes again after resizing.
                lz4.decompressPrepended(b.arena.items[payload_at .. at + len], b.arena.items[out_at..][0..raw_len]) catch |err|
                    return status.fail(error.InvalidCache, "failed to decompress lz4 payload: {s}", .{lz4.describe(err)});
                try b.payload_offsets.append(gpa, out_at);
                try b.payload_lens.append(gpa, raw_len);
            },
        }
        try b.cache_ids.append(gpa, c.cache_id);
        try b.sample_ids.append(gpa, loc.sample_id);
    }

    fn view(b: *const BatchBuffers) abi.Batch {
        return .{
            .count = b.cache_ids.items.len,
            .payload_base = b.arena.items.ptr,
            .payload_offsets = b.payload_offsets.items.ptr,
            .payload_lens = b.payload_lens.items.ptr,
            .cache_ids = b.cache_ids.items.ptr,
            .sample_ids = b.sample_ids.items.ptr,
            .columns = b.views.ptr,
        };
    }
};

fn matchesRow(fields: []const schema.Field, values: []const schema.Value, a: dataset_mod.Attached, row: u64) bool {
    const r: usize = @intCast(row);
    for (fields, values, a.columns) |f, v, col| {
        const same = switch (f.kind) {
            .bool => @as([*]const u8, @ptrCast(col.values.?))[r] == @intFromBool(v.bool),
            .int => @as([*]const i64, @ptrCast(@alignCast(col.values.?)))[r] == v.int,
            .float => @as(u64, @bitCast(@as([*]const f64, @ptrCast(@alignCast(col.values.?)))[r])) == @as(u64, @bitCast(v.float)),
            .string => blk: {
                const offs = col.offsets.?;
                const s = @as([*]const u8, @ptrCast(col.values.?))[@intCast(offs[r])..@intCast(offs[r + 1])];
                break :blk std.mem.eql(u8, s, v.string);
            },
        };
        if (!same) return false;
    }
    return true;
}

pub const Iter = struct {
    ds: *Dataset,
    table: *Table,
    start: u64,
    len: u64,
    next: u64 = 0,
    finished: bool = false,
    locs: std.ArrayList(Loc) = .empty,
    buffers: BatchBuffers,

    pub fn open(ds: *Dataset) status.Error!*Iter {
        try ds.runtime.checkPid();
        const gpa = ds.gpa;
        var buffers = try BatchBuffers.init(gpa, ds.fields.len);
        errdefer buffers.deinit(gpa);
        const it = try gpa.create(Iter);
        const window = ds.reserveWindow();
        it.* = .{ .ds = ds.retain(), .table = window.table, .start = window.start, .len = window.len, .buffers = buffers };
        return it;
    }

    /// Fills `out` with the next samples (count 0 at the end). See drt_iter_next_batch.
    pub fn nextBatch(it: *Iter, max_count: u64, out: *abi.Batch) status.Error!void {
        try it.ds.runtime.checkPid();
        if (max_count == 0) return status.fail(error.InvalidArgument, "max_count must be at least 1", .{});
        if (it.finished or it.next >= it.len) {
            it.finished = true;
            out.* = std.mem.zeroes(abi.Batch);
            return;
        }
        errdefer it.finished = true;
        const n: usize = @intCast(@min(max_count, it.ds.options.prefetch_size, it.len - it.next));
        it.locs.clearRetainingCapacity();
        try it.locs.ensureTotalCapacity(it.ds.gpa, n);
        for (0..n) |k| it.locs.appendAssumeCapacity(it.ds.locate(it.table, it.start +% (it.next + k)));
        try it.buffers.fill(it.ds, it.locs.items);
        it.next += n;
        out.* = it.buffers.view();
    }

    pub fn close(it: *Iter) void {
        const ds = it.ds;
        if (ds.runtime.checkPid()) |_| {} else |_| return;
        it.buffers.deinit(ds.gpa);
        it.locs.deinit(ds.gpa);
        it.table.release();
        ds.gpa.destroy(it);
        ds.release();
    }
};

pub const Lookup = struct {
    ds: *Dataset,
    locs: std.ArrayList(Loc) = .empty,
    buffers: BatchBuffers,

    pub fn open(ds: *Dataset) status.Error!*Lookup {
        try ds.runtime.checkPid();
        var buffers = try BatchBuffers.init(ds.gpa, ds.fields.len);
        errdefer buffers.deinit(ds.gpa);
        const lk = try ds.gpa.create(Lookup);
        lk.* = .{ .ds = ds.retain(), .buffers = buffers };
        return lk;
    }

    pub fn get(lk: *Lookup, cache_ids: []const u64, sample_ids: []const u64, out: *abi.Batch) status.Error!void {
        try lk.ds.runtime.checkPid();
        lk.locs.clearRetainingCapacity();
        try lk.locs.ensureTotalCapacity(lk.ds.gpa, cache_ids.len);
        for (cache_ids, sample_ids) |cid, sid| lk.locs.appendAssumeCapacity(try lk.ds.locFor(cid, sid));
        try lk.buffers.fill(lk.ds, lk.locs.items);
        out.* = lk.buffers.view();
    }

    pub fn close(lk: *Lookup) void {
        const ds = lk.ds;
        if (ds.runtime.checkPid()) |_| {} else |_| return;
        lk.buffers.deinit(ds.gpa);
        lk.locs.deinit(ds.gpa);
        ds.gpa.destroy(lk);
        ds.release();
    }
};
