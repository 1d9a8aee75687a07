//! Lookups: random access by identity (`get_item`, `get_items`), read synchronously on
//! the calling thread through the I/O layer's positioned read; no cursor moves.
//!
//! A call with several identities is planned like an iterator's reads: the records are
//! visited in (cache, sample id) order, which for a cache written by any writer is shard
//! and offset order; each record is read once however often it is asked for, and records
//! adjacent in one shard are read together (up to `plan.coalesce_bytes_max`). The batch
//! still lists the samples in the caller's order.
//!
//! Errors: one bad identity or unreadable record fails the whole call with exactly the
//! error `get_item` raises for the first failing identity in the caller's order. Planned
//! reads meet failures in another order, so a failed planned call is redone one identity
//! at a time in the caller's order (errors are rare; the retry names the right one).
//!
//! Small reads (under `mapped_read_max` bytes: single records of small-record caches)
//! are copied out of a read-only shared mapping of a shard window (`io/files.zig` `Maps`,
//! within its byte budget `random_mapped_bytes_max`, 132 MiB), made on first use, instead of a pread
//! each: no system call per record. A shard is mapped only when its file is at least as
//! long as the manifest says (rows are checked against that length first), else it is
//! read with pread, which reports a short file as the reference does; cache files are
//! never changed once published, so a mapping stays valid. A read the budget leaves
//! unmapped uses pread. Windows used by a call stay mapped until the next call.
//! `MADV_RANDOM`: a fault reads one page, as a pread of a small record would.
//!
//! Invariant: batch pointers into `raw` and `reads` are taken only after every record of
//! the call was read, so neither moves any more; they stay valid until the next call on
//! the lookup.

const std = @import("std");
const status = @import("../base/status.zig");
const shard = @import("../format/shard.zig");
const io = @import("../io/backend.zig");
const files_mod = @import("../io/files.zig");
const dataset_mod = @import("dataset.zig");
const batch_mod = @import("batch.zig");
const plan = @import("plan.zig");
const record = @import("record.zig");
const Dataset = dataset_mod.Dataset;
const Loc = dataset_mod.Loc;
const Cache = @import("../store/cache.zig").Cache;
const index = @import("../format/index.zig");
const schema = @import("../format/schema.zig");
const metadata_json = @import("../format/metadata_json.zig");

/// A planned call with at most this many identities sorts keys holding the identity and
/// its position (at most 32 bits); larger calls are split into such parts.
const planned_count_max = std.math.maxInt(u32);

/// Reads shorter than this are copied from the shard's mapping (see the top comment).
const mapped_read_max = 16 << 10;

/// One positioned read of a planned call: `len` bytes at `offset` of a shard, into
/// `reads[at..]`, or left where they are in the shard's mapping (`mapped`). `lz4`: the
/// shard's payloads are compressed.
const SpanRead = struct { cache: u32, shard_id: u64, offset: u64, len: u64, at: u64, lz4: bool, mapped: ?[*]const u8 = null };

/// One distinct record of a planned call: planned, its read (index into `span_reads`)
/// and its `len` bytes at `at` of the call's reads (`SpanRead.at` counts the same way);
/// once read and split, its JSON and payload as (address, length). A payload
/// decompressed into `raw` holds its offset there until `raw` stops growing (`in_raw`
/// set in the length), then its address.
const PlannedRecord = struct {
    span: u32,
    at: u64,
    len: u64,
    json: [2]u64 = undefined,
    payload: [2]u64 = undefined,
};

/// How a planned call packs an identity and its position into one integer key: the
/// position in the low `position_bits`, above it the sample id (`sample_id_bits`), above
/// that the cache index. Sorting the keys sorts by (cache, sample id), then position.
/// With the bit counts of the dataset's widest cache index and sample id, most calls fit
/// in 64 bits; the others use 128 (a 32-bit position, a 64-bit sample id).
fn KeyLayout(comptime K: type) type {
    return struct {
        position_bits: std.math.Log2Int(K),
        sample_id_bits: std.math.Log2Int(K),

        const Self = @This();

        fn keyOf(l: Self, loc: Loc, position: usize) K {
            return ((@as(K, loc.cache) << l.sample_id_bits | loc.sample_id) << l.position_bits) | @as(K, @intCast(position));
        }

        fn positionOf(l: Self, k: K) usize {
            return @intCast(k & ((@as(K, 1) << l.position_bits) - 1));
        }

        /// The (cache, sample id) part, equal for equal identities.
        fn identityOf(l: Self, k: K) K {
            return k >> l.position_bits;
        }

        fn locOf(l: Self, identity_bits: K) Loc {
            return .{
                .cache = @intCast(identity_bits >> l.sample_id_bits),
                .sample_id = @intCast(identity_bits & ((@as(K, 1) << l.sample_id_bits) - 1)),
            };
        }
    };
}

/// Bits needed to hold `x` (0 for 0).
fn bitsFor(x: u64) u7 {
    return @intCast(64 - @clz(x));
}

pub const Lookup = struct {
    ds: *Dataset,
    files: files_mod.Files = .{},
    record: std.ArrayList(u8) = .empty,
    raw: std.ArrayList(u8) = .empty,
    /// (start, len) of each sample's payload and JSON in `raw`, filled before batching so
    /// that pointers into `raw` are taken only after it stops growing.
    spans: std.ArrayList([2]u64) = .empty,
    jsons: std.ArrayList([2]u64) = .empty,
    /// Each identity's location, resolved once per call.
    locs: std.ArrayList(Loc) = .empty,
    /// Planned calls: the identities' sort keys (`KeyLayout`): 64-bit when the call's
    /// layout fits (`keys64`), else 128-bit (`keys`); each with the radix sort's second
    /// buffer (see `radixSort`).
    keys64: std.ArrayList(u64) = .empty,
    keys64_scratch: std.ArrayList(u64) = .empty,
    keys: std.ArrayList(u128) = .empty,
    keys_scratch: std.ArrayList(u128) = .empty,
    /// Each identity's distinct record (index into `records`), in the caller's order.
    record_of: std.ArrayList(u32) = .empty,
    /// The call's distinct records in (cache, sample id) order, the coalesced reads and
    /// the bytes they read (`reads`; mapped spans stay in their mapping).
    records: std.ArrayList(PlannedRecord) = .empty,
    span_reads: std.ArrayList(SpanRead) = .empty,
    /// Each identity's payload, in the caller's order (what `finishBatch` batches).
    payloads: std.ArrayList([]const u8) = .empty,
    reads: std.ArrayList(u8) = .empty,
    /// Shard windows mapped on first small read (see the top comment).
    maps: files_mod.Maps = .{ .random = true, .budget = files_mod.random_mapped_bytes_max },
    /// Mapped reads so far (each one's stamp in `maps`), and the count when the current
    /// call started: windows used since then are pinned.
    map_stamp: u64 = 0,
    call_stamp: u64 = 0,
    /// The window of the last mapped read (`mapped`): sorted reads mostly fall in the
    /// window of the previous one, which is then known without asking `maps`.
    last_window: LastWindow = .{},
    batch: batch_mod.Buffers,
    /// `getRow`'s field values (one per schema field) and the unescaped string bytes
    /// they may point into.
    values: []schema.Value,
    scratch: std.ArrayList(u8) = .empty,
    /// `getRow`'s parse diagnostics, read only after a parse failed (which sets it): kept
    /// here so a call does not initialize its 256-byte message buffer.
    diag: metadata_json.Diagnostic = .{},
    /// The cache of the last identity located (`locate`): calls mostly ask one cache
    /// again, and its index is then known without a hash lookup.
    last_cache_id: u64 = 0,
    last_cache: ?u32 = null,
    /// `getRegisteredRow`'s destination (drt_lookup_set_row_buffer): caller memory, borrowed while
    /// registered; empty when none is.
    row_buffer: []u8 = &.{},
    /// Bits of the widest sample id and cache index of the dataset (`KeyLayout`).
    sample_id_bits: u7 = 0,
    cache_bits: u7 = 0,

    /// A mapped window of a shard: `bytes` are its bytes from `start`; `stamp` is the
    /// `map_stamp` of the `maps.get` that returned it (0: none).
    const LastWindow = struct {
        cache: u32 = 0,
        shard_id: u64 = 0,
        start: u64 = 0,
        bytes: []const u8 = &.{},
        stamp: u64 = 0,
    };

    pub fn open(ds: *Dataset) status.Error!*Lookup {
        try ds.runtime.checkPid();
        const gpa = ds.gpa;
        var batch = try batch_mod.Buffers.init(gpa, ds.fields.len);
        errdefer batch.deinit(gpa);
        const values = try gpa.alloc(schema.Value, ds.fields.len);
        errdefer gpa.free(values);
        const lk = try gpa.create(Lookup);
        var sample_id_max: u64 = 0;
        for (ds.caches) |*c| sample_id_max = @max(sample_id_max, c.sampleCount() -| 1);
        lk.* = .{
            .ds = ds.retain(),
            .batch = batch,
            .values = values,
            .sample_id_bits = bitsFor(sample_id_max),
            .cache_bits = bitsFor(ds.caches.len -| 1),
        };
        return lk;
    }

    /// `Dataset.locFor` (same values, same errors), without its hash lookup when the
    /// cache is the previous identity's.
    fn locate(lk: *Lookup, cache_id: u64, sample_id: u64) status.Error!Loc {
        if (lk.last_cache) |ci| {
            if (cache_id == lk.last_cache_id and sample_id < lk.ds.caches[ci].sampleCount()) {
                return .{ .cache = ci, .sample_id = sample_id };
            }
        }
        const loc = try lk.ds.locFor(cache_id, sample_id);
        lk.last_cache_id = cache_id;
        lk.last_cache = loc.cache;
        return loc;
    }

    /// The samples with these identities, in this order; the first bad identity or
    /// unreadable record (in this order) fails the whole call.
    pub fn get(lk: *Lookup, cache_ids: []const u64, sample_ids: []const u64, contiguous: bool) status.Error!batch_mod.View {
        std.debug.assert(cache_ids.len == sample_ids.len);
        try lk.ds.runtime.checkPid();
        // Bytes handed out by the previous call are no longer referenced.
        lk.call_stamp = lk.map_stamp + 1;
        if (cache_ids.len < 2 or cache_ids.len > planned_count_max) return lk.getInOrder(cache_ids, sample_ids, contiguous);
        return lk.getPlanned(cache_ids, sample_ids, contiguous) catch |err| switch (err) {
            error.OutOfMemory => return err,
            // Redo it in the caller's order: the error of the first failing identity.
            else => return lk.getInOrder(cache_ids, sample_ids, contiguous),
        };
    }

    /// The metadata.arrow rows of samples `first..first + count` of cache `cache_id` as a
    /// batch (see drt_lookup_stored_rows): identities and metadata columns as written,
    /// every payload empty; no record is read. The batch stops at the cache's last
    /// sample, or before the first row that holds a null (its value is the record's
    /// embedded JSON: `get` reads it). Fails with `get`'s error.Index (and message) when
    /// the cache or sample `first` does not exist.
    pub fn storedRows(lk: *Lookup, cache_id: u64, first: u64, count: u64) status.Error!batch_mod.View {
        const ds = lk.ds;
        try ds.runtime.checkPid();
        const stored = lk.batch.stored_metadata;
        lk.batch.stored_metadata = true;
        defer lk.batch.stored_metadata = stored;
        try lk.batch.reset(ds.gpa, ds.fields);
        const loc = try lk.locate(cache_id, first);
        const rows = @min(count, ds.caches[loc.cache].sampleCount() - first);
        _ = try lk.batch.addStoredRows(ds, loc.cache, first, rows);
        return lk.batch.view(ds.fields, false);
    }

    /// One sample packed into `dst` (see drt_lookup_get_row): the packed size, the
    /// payload length, one 8-byte slot per field, the payload, the string bytes. Returns
    /// the size; only it is written when it exceeds `dst.len`. Values and errors are
    /// `get`'s. Pre: `dst.len >= 8`.
    ///
    /// A record in a mapped window of an uncompressed shard (without validate_cache) is
    /// packed straight from the mapping, its JSON parsed into `values`: no copy into the
    /// lookup's buffers, no batch. Any other goes through `get`.
    pub fn getRow(lk: *Lookup, cache_id: u64, sample_id: u64, dst: []u8) status.Error!u64 {
        std.debug.assert(dst.len >= 8);
        try lk.ds.runtime.checkPid();
        // Bytes handed out by the previous call are no longer referenced.
        lk.call_stamp = lk.map_stamp + 1;
        if (try lk.getRowMapped(cache_id, sample_id)) |rec| return packRow(lk.ds.fields, lk.values, rec.stored_payload, dst);
        const view = try lk.get(&.{cache_id}, &.{sample_id}, false);
        std.debug.assert(view.count == 1);
        for (view.columns, lk.values) |col, *v| {
            v.* = switch (col.kind) {
                .bool => .{ .bool = @as([*]const u8, @ptrCast(col.values.?))[0] != 0 },
                .int => .{ .int = @as([*]const i64, @ptrCast(@alignCast(col.values.?)))[0] },
                .float => .{ .float = @as([*]const f64, @ptrCast(@alignCast(col.values.?)))[0] },
                .string => .{ .string = @as([*]const u8, @ptrCast(col.values.?))[0..@intCast(col.offsets.?[1])] },
            };
        }
        const payload_len: usize = @intCast(view.payload_lens.?[0]);
        return packRow(lk.ds.fields, lk.values, view.payloads.?[0][0..payload_len], dst);
    }

    /// Registers `dst` as `getRegisteredRow`'s destination (empty: none). The caller keeps it alive
    /// and unchanged until it registers another or closes the lookup. Pre: `dst` is
    /// empty or at least 8 bytes long.
    pub fn setRowBuffer(lk: *Lookup, dst: []u8) void {
        std.debug.assert(dst.len == 0 or dst.len >= 8);
        lk.row_buffer = dst;
    }

    /// `getRow` into the registered row buffer (drt_lookup_row): same size, bytes and
    /// errors; error.InvalidArgument when no buffer is registered.
    pub fn getRegisteredRow(lk: *Lookup, cache_id: u64, sample_id: u64) status.Error!u64 {
        if (lk.row_buffer.len == 0) return status.fail(error.InvalidArgument, "drt_lookup_row needs a row buffer: call drt_lookup_set_row_buffer first", .{});
        return lk.getRow(cache_id, sample_id, lk.row_buffer);
    }

    /// `getRow`'s direct path: the record split in place in its shard's mapping and its
    /// metadata in `values` (JSON nulls resolved from metadata.arrow, as `Buffers.add`
    /// does), or null when the record is not for this path (nothing counted as read
    /// then). Errors are `get`'s, met in the same order (identity, place, record, JSON,
    /// metadata.arrow).
    fn getRowMapped(lk: *Lookup, cache_id: u64, sample_id: u64) status.Error!?shard.Record {
        const ds = lk.ds;
        if (ds.options.validate_cache) return null;
        const loc = try lk.locate(cache_id, sample_id);
        const row = try checkRow(ds, loc);
        const c = &ds.caches[loc.cache];
        if (c.manifest.shards[@intCast(row.shard_id)].compression != .none) return null;
        const bytes = lk.mappedAt(loc.cache, row.shard_id, row.byte_len, row.offset) orelse return null;
        const rec = shard.split(bytes) catch |err| return ds.recordError(loc, err);
        lk.scratch.clearRetainingCapacity();
        const diag = &lk.diag;
        metadata_json.parseRecord(rec.json, ds.fields, lk.values, &lk.scratch, ds.gpa, diag) catch |err| switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            // The messages of batch.zig's addParsed.
            error.Invalid => return ds.recordError(loc, switch (diag.kind) {
                .json => status.fail(error.Json, "JSON error: {s}", .{diag.message()}),
                .invalid_cache => status.failText(error.InvalidCache, diag.message()),
            }),
        };
        for (lk.values, 0..) |*v, fi| {
            if (v.* != .null) continue;
            // How the reference stores NaN and infinite floats: the value is in
            // metadata.arrow (see batch.zig's addParsed).
            const md = try c.metadataFile();
            const place = md.locate(sample_id);
            v.* = .{ .float = md.batches[place.batch].columns[fi].getFloat(place.index) };
        }
        return rec;
    }

    /// Packs a sample as drt_lookup_get_row lays it out (see `getRow`); returns its
    /// size, having written only the size when it does not fit in `dst`.
    fn packRow(fields: []const schema.Field, values: []const schema.Value, payload: []const u8, dst: []u8) u64 {
        var size: u64 = 16 + 8 * @as(u64, fields.len) + payload.len;
        for (fields, values) |f, v| if (f.kind == .string) {
            size += v.string.len;
        };
        std.mem.writeInt(u64, dst[0..8], size, .little);
        if (size > dst.len) return size;
        std.mem.writeInt(u64, dst[8..16], payload.len, .little);
        var pos: usize = 16 + 8 * fields.len;
        @memcpy(dst[pos..][0..payload.len], payload);
        pos += payload.len;
        for (fields, values, 0..) |f, v, fi| {
            const slot = dst[16 + 8 * fi ..][0..8];
            switch (f.kind) {
                .bool => std.mem.writeInt(u64, slot, @intFromBool(v.bool), .little),
                .int => std.mem.writeInt(i64, slot, v.int, .little),
                .float => std.mem.writeInt(u64, slot, @bitCast(v.float), .little),
                .string => {
                    std.mem.writeInt(u64, slot, v.string.len, .little);
                    @memcpy(dst[pos..][0..v.string.len], v.string);
                    pos += v.string.len;
                },
            }
        }
        std.debug.assert(pos == size);
        return size;
    }

    /// Validates a record's place in its shard (the manifest's length), as a read of it
    /// would fail.
    fn checkRow(ds: *const Dataset, loc: Loc) status.Error!index.Row {
        return checkRowOf(&ds.caches[loc.cache], loc.sample_id);
    }

    /// `checkRow` for sample `sample_id` of cache `c`.
    inline fn checkRowOf(c: *const Cache, sample_id: u64) status.Error!index.Row {
        const row = c.row(sample_id);
        const shard_len = c.manifest.shards[@intCast(row.shard_id)].byte_len;
        if (row.offset > shard_len or row.byte_len > shard_len - row.offset) {
            return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{c.shard_paths[@intCast(row.shard_id)]});
        }
        return row;
    }

    /// The `len` bytes at `offset` of a shard in its mapping, for a small read (counted
    /// as one lookup read), or null: then read them with `readAt`. The caller checked the
    /// range against the manifest's shard length.
    fn mappedAt(lk: *Lookup, cache: u32, shard_id: u64, len: u64, offset: u64) ?[]const u8 {
        const bytes = lk.mapped(cache, shard_id, len, offset) orelse return null;
        lk.ds.countRead(null, len);
        return bytes;
    }

    /// `mappedAt` without counting the read (the caller counts it).
    fn mapped(lk: *Lookup, cache: u32, shard_id: u64, len: u64, offset: u64) ?[]const u8 {
        if (len >= mapped_read_max or len == 0) return null;
        // The last window, when this call mapped it: this call's windows are pinned
        // (not unmapped before the next call), so its bytes are still mapped.
        const w = &lk.last_window;
        if (w.stamp >= lk.call_stamp and w.cache == cache and w.shard_id == shard_id and
            offset >= w.start and offset - w.start < @min(files_mod.window_bytes, w.bytes.len) and len <= w.bytes.len - (offset - w.start))
        {
            return w.bytes[@intCast(offset - w.start)..][0..@intCast(len)];
        }
        const ds = lk.ds;
        if (ds.caches[cache].readsRanges(shard_id, .lookup)) return null; // see readAt
        const shard_len = ds.caches[cache].manifest.shards[@intCast(shard_id)].byte_len;
        lk.map_stamp += 1;
        const bytes = lk.maps.get(ds.gpa, .{ .cache = cache, .shard_id = shard_id }, shard_len, offset, len, &lk.files, Dataset.ShardOpener{ .ds = ds }, .{
            .now = lk.map_stamp,
            .pinned_from = lk.call_stamp,
            .resident_only = false,
        }) orelse return null;
        // `maps.last` is the window that served the range (see `Maps.last`); a read in
        // its first `window_bytes` is served by it as `maps.get` would serve it.
        const window = &lk.maps.windows[lk.maps.last];
        std.debug.assert(window.key.cache == cache and window.key.shard_id == shard_id);
        const start = window.number * files_mod.window_bytes;
        std.debug.assert(@intFromPtr(bytes.ptr) == @intFromPtr(window.bytes.ptr) + (offset - start));
        lk.last_window = .{ .cache = cache, .shard_id = shard_id, .start = start, .bytes = window.bytes, .stamp = lk.map_stamp };
        return bytes;
    }

    /// Reads `buf.len` bytes at `offset` of a shard, counted as one lookup read. The
    /// caller checked the range against the manifest's shard length.
    fn readAt(lk: *Lookup, cache: u32, shard_id: u64, buf: []u8, offset: u64) status.Error!void {
        const ds = lk.ds;
        if (lk.mappedAt(cache, shard_id, buf.len, offset)) |bytes| {
            @memcpy(buf, bytes);
            return;
        }
        if (ds.caches[cache].readsRanges(shard_id, .lookup)) {
            // A remote shard not in the local shard cache: a byte-range read.
            try ds.caches[cache].readRange(shard_id, offset, buf);
            ds.countRead(null, buf.len);
            return;
        }
        const path = ds.caches[cache].shard_paths[@intCast(shard_id)];
        const handle = try lk.files.acquire(.{ .cache = cache, .shard_id = shard_id }, Dataset.ShardOpener{ .ds = ds });
        defer lk.files.release(handle);
        switch (io.readAll(handle.fd, buf, offset)) {
            .ok => {},
            .eof => return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{path}),
            .os => |e| return status.failErrno(e, path),
            .pending => unreachable,
        }
        ds.countRead(null, buf.len);
    }

    /// Identities in the caller's order, one read each: the reference behaviour, used
    /// for single identities and to name the failing identity of a planned call.
    fn getInOrder(lk: *Lookup, cache_ids: []const u64, sample_ids: []const u64, contiguous: bool) status.Error!batch_mod.View {
        const ds = lk.ds;
        const gpa = ds.gpa;
        lk.raw.clearRetainingCapacity();
        lk.spans.clearRetainingCapacity();
        lk.jsons.clearRetainingCapacity();
        lk.locs.clearRetainingCapacity();
        // Pass 1: read each record; keep JSON and (decompressed) payload bytes in `raw`.
        for (cache_ids, sample_ids) |cid, sid| {
            const loc = try lk.locate(cid, sid);
            try lk.locs.append(gpa, loc);
            const row = try checkRow(ds, loc);
            try record.growUninit(&lk.record, gpa, @intCast(row.byte_len));
            try lk.readAt(loc.cache, row.shard_id, lk.record.items, row.offset);
            const rec = shard.split(lk.record.items) catch |err| return ds.recordError(loc, err);
            try lk.jsons.append(gpa, .{ lk.raw.items.len, rec.json.len });
            try lk.raw.appendSlice(gpa, rec.json);
            const payload_at = lk.raw.items.len;
            switch (ds.caches[loc.cache].manifest.shards[@intCast(row.shard_id)].compression) {
                .none => try lk.raw.appendSlice(gpa, rec.stored_payload),
                .lz4 => _ = record.appendDecompressed(&lk.raw, gpa, rec.stored_payload) catch |err| return ds.recordError(loc, err),
            }
            try lk.spans.append(gpa, .{ payload_at, lk.raw.items.len - payload_at });
        }
        // `raw` no longer grows: the payloads' addresses.
        lk.payloads.clearRetainingCapacity();
        try lk.payloads.ensureTotalCapacity(gpa, lk.spans.items.len);
        const raw = lk.raw.items;
        for (lk.spans.items, lk.jsons.items) |p, j| {
            // An empty payload gets its JSON's address, as `Buffers.add` gives it.
            const start: usize = @intCast(if (p[1] == 0) j[0] else p[0]);
            lk.payloads.appendAssumeCapacity(raw[start..][0..@intCast(p[1])]);
        }
        return lk.finishBatch(contiguous, .in_order);
    }

    /// Where `finishBatch` finds each sample's JSON: (start, len) in `raw` (`jsons`), or
    /// its planned record's (`records`, `record_of`).
    const Source = enum { in_order, planned };

    /// The last pass of both paths: batch the samples in the caller's order (`locs`,
    /// `payloads`, the JSON of `source`), now that no buffer they are in moves.
    fn finishBatch(lk: *Lookup, contiguous: bool, source: Source) status.Error!batch_mod.View {
        const ds = lk.ds;
        const gpa = ds.gpa;
        const n = lk.locs.items.len;
        std.debug.assert(lk.payloads.items.len == n);
        try lk.batch.reset(gpa, ds.fields);
        const locs = lk.locs.items;
        const payloads = lk.payloads.items;
        var i: usize = 0;
        while (i < n) {
            if (lk.batch.stored_metadata) {
                // Stored metadata: in runs (`Buffers.addStoredRun`); a sample it leaves
                // (a null in its row) goes through `add`.
                const added = try lk.batch.addStoredRun(ds, locs[i..], payloads[i..]);
                if (added > 0) {
                    i += added;
                    continue;
                }
            } else if (i + prefetch_distance < n) lk.batch.prefetch(ds, locs[i + prefetch_distance]);
            lk.batch.add(ds, locs[i], lk.jsonOf(source, i), payloads[i]) catch |err| return ds.recordError(locs[i], err);
            i += 1;
        }
        if (contiguous) try lk.batch.pack(gpa, 0);
        return lk.batch.view(ds.fields, contiguous);
    }

    /// Sample `i`'s JSON in `finishBatch`.
    fn jsonOf(lk: *const Lookup, source: Source, i: usize) []const u8 {
        return switch (source) {
            .in_order => lk.raw.items[@intCast(lk.jsons.items[i][0])..][0..@intCast(lk.jsons.items[i][1])],
            .planned => blk: {
                const j = lk.records.items[lk.record_of.items[i]].json;
                break :blk at(j[0])[0..@intCast(j[1])];
            },
        };
    }

    /// How many identities ahead a call in random order starts loading a record's
    /// metadata.arrow values (enough to overlap several memory latencies).
    const prefetch_distance = 8;

    /// How many records ahead a planned call starts loading an index row (`planKeys`)
    /// and a record's first bytes (`splitPlanned`): only the line its split reads. Loading
    /// whole records there (up to 4 KiB each, 8 ahead) kept so many lines in flight that
    /// the headers waited behind payload bytes: W1's 4096 random records per call took
    /// 1.4-1.6x as long (in-process A/B, 2026-12-06). The payloads are loaded by their
    /// copy (`batch.gatherPayloads` prefetches its own).
    const header_prefetch_distance = 16;

    /// Marks a planned record's payload that is still an offset in `raw`.
    const in_raw: u64 = 1 << 63;

    fn at(addr: u64) [*]const u8 {
        return @ptrFromInt(@as(usize, @intCast(addr)));
    }

    fn address(bytes: []const u8) u64 {
        return @intFromPtr(bytes.ptr);
    }

    /// Several identities, planned: validated in the caller's order, then each distinct
    /// record read once, in (cache, sample id) order, adjacent records coalesced.
    fn getPlanned(lk: *Lookup, cache_ids: []const u64, sample_ids: []const u64, contiguous: bool) status.Error!batch_mod.View {
        const n = cache_ids.len;
        std.debug.assert(n >= 2 and n <= planned_count_max);
        const position_bits = bitsFor(n - 1);
        if (@as(u8, position_bits) + lk.sample_id_bits + lk.cache_bits <= 64) {
            const layout: KeyLayout(u64) = .{ .position_bits = @intCast(position_bits), .sample_id_bits = @intCast(lk.sample_id_bits) };
            try lk.planKeys(u64, layout, &lk.keys64, &lk.keys64_scratch, cache_ids, sample_ids);
        } else {
            const layout: KeyLayout(u128) = .{ .position_bits = 32, .sample_id_bits = 64 };
            try lk.planKeys(u128, layout, &lk.keys, &lk.keys_scratch, cache_ids, sample_ids);
        }
        try lk.readPlanned();
        try lk.splitPlanned();
        // The batch in the caller's order, from the records now that no buffer moves.
        const gpa = lk.ds.gpa;
        lk.payloads.clearRetainingCapacity();
        try lk.payloads.ensureTotalCapacity(gpa, n);
        const records = lk.records.items;
        for (lk.record_of.items) |r| {
            const p = records[r].payload;
            lk.payloads.appendAssumeCapacity(at(p[0])[0..@intCast(p[1])]);
        }
        return lk.finishBatch(contiguous, .planned);
    }

    /// Passes 1 and 2 of a planned call: identities located in the caller's order (its
    /// errors first), their keys sorted, then in (cache, sample id) order each distinct
    /// record checked against its shard and given its place in the coalesced reads.
    fn planKeys(
        lk: *Lookup,
        comptime K: type,
        layout: KeyLayout(K),
        keys_list: *std.ArrayList(K),
        scratch_list: *std.ArrayList(K),
        cache_ids: []const u64,
        sample_ids: []const u64,
    ) status.Error!void {
        const ds = lk.ds;
        const gpa = ds.gpa;
        const n = cache_ids.len;
        try keys_list.ensureTotalCapacity(gpa, n);
        keys_list.items.len = n; // every entry is set below
        try lk.locs.ensureTotalCapacity(gpa, n);
        lk.locs.items.len = n;
        const keys = keys_list.items;
        // `locate`, with the last cache's id, index and sample count in registers.
        var last_id: u64 = lk.last_cache_id;
        var last: u32 = lk.last_cache orelse std.math.maxInt(u32);
        var last_count: u64 = if (lk.last_cache) |ci| ds.caches[ci].sampleCount() else 0;
        for (cache_ids, sample_ids, lk.locs.items, keys, 0..) |cid, sid, *loc, *key, i| {
            if (cid == last_id and sid < last_count) {
                loc.* = .{ .cache = last, .sample_id = sid };
            } else {
                loc.* = try lk.locate(cid, sid);
                last_id = cid;
                last = loc.cache;
                last_count = ds.caches[last].sampleCount();
            }
            key.* = layout.keyOf(loc.*, i);
        }
        try scratch_list.ensureTotalCapacity(gpa, n);
        scratch_list.items.len = n;
        if (radixSort(K, keys, scratch_list.items, layout.position_bits) == .scratch) {
            std.mem.swap(std.ArrayList(K), keys_list, scratch_list);
        }
        const sorted = keys_list.items;

        try lk.record_of.ensureTotalCapacity(gpa, n);
        lk.record_of.items.len = n; // every entry is set below
        const record_of = lk.record_of.items;
        lk.records.clearRetainingCapacity();
        try lk.records.ensureTotalCapacity(gpa, n);
        lk.span_reads.clearRetainingCapacity();
        try lk.span_reads.ensureTotalCapacity(gpa, n); // at most one per record: never moves
        var total: u64 = 0;
        // No key's identity is all ones (the position takes at least one bit).
        var previous: K = std.math.maxInt(K);
        // The cache of the previous record (keys are sorted by cache first) and the
        // coalesced read it ended.
        var cache_index: u32 = std.math.maxInt(u32);
        var c: *const Cache = undefined;
        var span: ?*SpanRead = null;
        for (sorted, 0..) |key, k| {
            if (k + header_prefetch_distance < n) {
                // Start loading an index row a few records ahead (random calls read rows
                // far apart).
                const ahead = layout.locOf(layout.identityOf(sorted[k + header_prefetch_distance]));
                @prefetch(ds.caches[ahead.cache].index_map.ptr + index.row_bytes * @as(usize, @intCast(ahead.sample_id)), .{});
            }
            const i = layout.positionOf(key);
            const identity = layout.identityOf(key);
            if (identity == previous) {
                record_of[i] = @intCast(lk.records.items.len - 1); // the same record again: read once
                continue;
            }
            previous = identity;
            const loc = layout.locOf(identity);
            if (loc.cache != cache_index) {
                cache_index = loc.cache;
                c = &ds.caches[loc.cache];
            }
            const row = try checkRowOf(c, loc.sample_id);
            if (span != null and span.?.cache == loc.cache and span.?.shard_id == row.shard_id and
                span.?.offset + span.?.len == row.offset and span.?.len < plan.coalesce_bytes_max)
            {
                span.?.len += row.byte_len;
            } else {
                const lz4 = c.manifest.shards[@intCast(row.shard_id)].compression == .lz4;
                span = lk.span_reads.addOneAssumeCapacity();
                span.?.* = .{ .cache = loc.cache, .shard_id = row.shard_id, .offset = row.offset, .len = row.byte_len, .at = total, .lz4 = lz4 };
            }
            record_of[i] = @intCast(lk.records.items.len);
            lk.records.appendAssumeCapacity(.{ .span = @intCast(lk.span_reads.items.len - 1), .at = total, .len = row.byte_len });
            total += row.byte_len;
        }
        try record.growUninit(&lk.reads, gpa, @intCast(total));
    }

    /// Pass 3 of a planned call: each coalesced read from the shard's mapping (small
    /// ones) or into `reads`, which was sized once and never moves afterwards.
    fn readPlanned(lk: *Lookup) status.Error!void {
        const ds = lk.ds;
        // The mapped reads are counted once for the call (what was read, also on failure).
        var mapped_reads: u64 = 0;
        var mapped_bytes: u64 = 0;
        defer ds.countReads(null, mapped_reads, mapped_bytes);
        for (lk.span_reads.items) |*s| {
            if (lk.mapped(s.cache, s.shard_id, s.len, s.offset)) |bytes| {
                s.mapped = bytes.ptr;
                mapped_reads += 1;
                mapped_bytes += s.len;
            } else {
                try lk.readAt(s.cache, s.shard_id, lk.reads.items[@intCast(s.at)..][0..@intCast(s.len)], s.offset);
            }
        }
    }

    /// Pass 4 of a planned call: each distinct record split where it was read (in
    /// (cache, sample id) order, so mostly forward through memory); LZ4 payloads
    /// decompressed into `raw`, whose addresses are taken once it stops growing.
    fn splitPlanned(lk: *Lookup) status.Error!void {
        const gpa = lk.ds.gpa;
        const reads = lk.reads.items;
        const spans = lk.span_reads.items;
        lk.raw.clearRetainingCapacity();
        var decompressed = false;
        const records = lk.records.items;
        for (records, 0..) |*r, k| {
            if (k + header_prefetch_distance < records.len) {
                // Start loading the header of a record a few ahead (records lie apart in
                // random calls).
                const ahead = records[k + header_prefetch_distance];
                const s = spans[ahead.span];
                const base: [*]const u8 = s.mapped orelse reads[@intCast(s.at)..].ptr;
                @prefetch(base + @as(usize, @intCast(ahead.at - s.at)), .{});
            }
            const s = spans[r.span];
            const base: [*]const u8 = s.mapped orelse reads[@intCast(s.at)..].ptr;
            const rec = try @call(.always_inline, shard.split, .{base[@intCast(r.at - s.at)..][0..@intCast(r.len)]});
            r.json = .{ address(rec.json), rec.json.len };
            if (s.lz4) {
                const payload_at = lk.raw.items.len;
                const len = try record.appendDecompressed(&lk.raw, gpa, rec.stored_payload);
                r.payload = .{ payload_at, len | in_raw };
                decompressed = true;
            } else if (rec.stored_payload.len == 0) {
                // An empty payload gets its JSON's address, as `Buffers.add` gives it.
                r.payload = .{ address(rec.json), 0 };
            } else {
                r.payload = .{ address(rec.stored_payload), rec.stored_payload.len };
            }
        }
        if (!decompressed) return;
        const raw = lk.raw.items;
        for (lk.records.items) |*r| {
            if (r.payload[1] & in_raw == 0) continue;
            const len = r.payload[1] & ~in_raw;
            r.payload = .{ if (len == 0) r.json[0] else address(raw[@intCast(r.payload[0])..]), len };
        }
        std.debug.assert(lk.reads.items.ptr == reads.ptr);
    }

    /// Sorts `keys` by the bits above the low `skip` (a key's identity, see `KeyLayout`),
    /// stably, with `scratch` (as long) as the second buffer, and says which of the two
    /// holds the result. Nothing is done when they are in order already (a caller's
    /// sorted request); else a least-significant-digit radix sort over the bits that
    /// differ between keys, in digits of up to 11 bits (two passes for the sample ids of
    /// a cache of 4M samples), several times faster than a comparison sort. Positions of
    /// one identity keep their order (nothing depends on it).
    fn radixSort(comptime K: type, keys: []K, scratch: []K, skip: std.math.Log2Int(K)) enum { keys, scratch } {
        std.debug.assert(scratch.len == keys.len);
        if (keys.len < 2) return .keys;
        var sorted = true;
        var any: K = 0; // bits set in some key
        var every: K = std.math.maxInt(K); // bits set in all keys
        var previous = keys[0] >> skip;
        for (keys) |k| {
            any |= k;
            every &= k;
            const identity = k >> skip;
            sorted = sorted and previous <= identity;
            previous = identity;
        }
        if (sorted) return .keys;
        const differ = (any ^ every) >> skip;
        std.debug.assert(differ != 0); // else the keys were sorted
        const low: u8 = @as(u8, skip) + @ctz(differ);
        const high: u8 = @as(u8, skip) + @bitSizeOf(K) - @clz(differ);
        const passes = std.math.divCeil(u8, high - low, digit_bits_max) catch unreachable;
        const digit_bits: u8 = std.math.divCeil(u8, high - low, passes) catch unreachable;
        var src = keys;
        var dst = scratch;
        var counts: [1 << digit_bits_max]u32 = undefined;
        var shift = low;
        while (shift < high) : (shift += digit_bits) {
            const bits: u8 = @min(digit_bits, high - shift);
            const mask: K = (@as(K, 1) << @intCast(bits)) - 1;
            const sh: std.math.Log2Int(K) = @intCast(shift);
            const buckets = counts[0 .. @as(usize, 1) << @intCast(bits)];
            @memset(buckets, 0);
            for (src) |k| buckets[@intCast((k >> sh) & mask)] += 1;
            var sum: u32 = 0;
            for (buckets) |*c| {
                const here = c.*;
                c.* = sum;
                sum += here;
            }
            for (src) |k| {
                const d: usize = @intCast((k >> sh) & mask);
                dst[buckets[d]] = k;
                buckets[d] += 1;
            }
            std.mem.swap([]K, &src, &dst);
        }
        return if (src.ptr == keys.ptr) .keys else .scratch;
    }

    /// The widest digit `radixSort` sorts on in one pass (its counts take 8 KiB).
    const digit_bits_max = 11;

    pub fn close(lk: *Lookup) void {
        const ds = lk.ds;
        if (ds.runtime.checkPid()) |_| {} else |_| return;
        const gpa = ds.gpa;
        lk.files.deinit();
        lk.record.deinit(gpa);
        lk.raw.deinit(gpa);
        lk.spans.deinit(gpa);
        lk.jsons.deinit(gpa);
        lk.locs.deinit(gpa);
        lk.keys64.deinit(gpa);
        lk.keys64_scratch.deinit(gpa);
        lk.keys.deinit(gpa);
        lk.keys_scratch.deinit(gpa);
        lk.record_of.deinit(gpa);
        lk.records.deinit(gpa);
        lk.payloads.deinit(gpa);
        lk.span_reads.deinit(gpa);
        lk.reads.deinit(gpa);
        lk.maps.deinit(gpa);
        lk.batch.deinit(gpa);
        gpa.free(lk.values);
        lk.scratch.deinit(gpa);
        gpa.destroy(lk);
        ds.release();
    }
};

// ---------------------------------------------------------------- tests

const testing = std.testing;
const helpers = @import("testing.zig");

/// Gets `locs` in one call and checks every sample against expected.json.
fn expectGet(env: *const helpers.Env, lk: *Lookup, locs: []const Loc, contiguous: bool) !void {
    const gpa = testing.allocator;
    const cids = try gpa.alloc(u64, locs.len);
    defer gpa.free(cids);
    const sids = try gpa.alloc(u64, locs.len);
    defer gpa.free(sids);
    for (locs, cids, sids) |loc, *c, *s| {
        c.* = env.cache_ids[loc.cache];
        s.* = loc.sample_id;
    }
    const view = lk.get(cids, sids, contiguous) catch |err| return helpers.report(err, "Lookup.get");
    try testing.expectEqual(@as(u64, locs.len), view.count);
    try testing.expectEqual(contiguous, view.payload_base != null);
    for (locs, 0..) |loc, i| try env.expectSample(view, i, loc);
}

test "lookup: identities in any order, repeated, across caches, contiguous or not" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();

    const total = env.total();
    const in_order = try gpa.alloc(Loc, @intCast(total));
    defer gpa.free(in_order);
    for (in_order, 0..) |*loc, flat| loc.* = env.pathOrder(flat);
    const reversed = try gpa.dupe(Loc, in_order);
    defer gpa.free(reversed);
    std.mem.reverse(Loc, reversed);
    // Random identities with repeats, lz4 and plain caches interleaved.
    var prng = std.Random.DefaultPrng.init(11);
    var random: [300]Loc = undefined;
    for (&random) |*loc| loc.* = in_order[prng.random().uintLessThan(usize, in_order.len)];
    const few = [_]Loc{ .{ .cache = 2, .sample_id = 299 }, .{ .cache = 0, .sample_id = 0 }, .{ .cache = 2, .sample_id = 299 }, .{ .cache = 3, .sample_id = 4 } };

    // The dataset's own sample id width plans with 64-bit keys; a 60-bit width (as a
    // cache of 2^60 samples would have) sends the larger calls through 128-bit keys.
    const narrow = lk.sample_id_bits;
    for ([_]bool{ false, true }) |contiguous| {
        for ([_]u7{ narrow, 60 }) |bits| {
            lk.sample_id_bits = bits;
            for ([_][]const Loc{ in_order, reversed, &random, &few, few[0..1] }) |locs| {
                const before = env.ds.ioStats().lookup_reads;
                try expectGet(&env, lk, locs, contiguous);
                // At most one read per distinct record, counted as lookup reads.
                const reads = env.ds.ioStats().lookup_reads - before;
                try testing.expect(reads >= 1 and reads <= locs.len);
            }
        }
        lk.sample_id_bits = narrow;
        // Nothing asked, nothing read.
        const before = env.ds.ioStats().lookup_reads;
        try testing.expectEqual(@as(u64, 0), (try lk.get(&.{}, &.{}, contiguous)).count);
        try testing.expectEqual(before, env.ds.ioStats().lookup_reads);
    }
    const stats = env.ds.ioStats();
    try testing.expectEqual(@as(u64, 0), stats.uring_reads + stats.pool_reads);
}

test "lookup: several identities are read once each, adjacent records together" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    for (env.ds.caches, 0..) |*c, ci| {
        // Every sample of the cache, backwards and each twice: one read per shard (the
        // fixtures' shards are far below the coalescing limit).
        const n: usize = @intCast(c.sampleCount());
        const locs = try gpa.alloc(Loc, 2 * n);
        defer gpa.free(locs);
        for (0..n) |k| {
            locs[2 * k] = .{ .cache = @intCast(ci), .sample_id = n - 1 - k };
            locs[2 * k + 1] = locs[2 * k];
        }
        const before = env.ds.ioStats().lookup_reads;
        try expectGet(&env, lk, locs, ci % 2 == 0);
        try testing.expectEqual(@as(u64, c.manifest.shards.len), env.ds.ioStats().lookup_reads - before);
    }
    // One sample of each cache, last cache first: one read per sample.
    var locs: [helpers.same_schema.len]Loc = undefined;
    for (&locs, 0..) |*loc, k| loc.* = .{ .cache = @intCast(locs.len - 1 - k), .sample_id = 0 };
    const before = env.ds.ioStats().lookup_reads;
    try expectGet(&env, lk, &locs, false);
    try testing.expectEqual(@as(u64, locs.len), env.ds.ioStats().lookup_reads - before);
}

test "lookup: a record past its shard's end fails like get_item, naming the first such identity in the caller's order" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{"plain_one_shard"}, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    const a = env.cache_ids[0];
    // A single-identity call is the reference's error.
    const c = &env.ds.caches[0];
    const shards = @constCast(c.manifest.shards);
    const saved = shards[0].byte_len;
    shards[0].byte_len = c.row(5).offset; // records 5.. now reach past the end
    defer shards[0].byte_len = saved;
    try testing.expectError(error.Io, lk.get(&.{a}, &.{7}, false));
    const single = try gpa.dupe(u8, status.lastMessage());
    defer gpa.free(single);
    try testing.expect(std.mem.indexOf(u8, single, "failed to fill whole buffer") != null);
    // Planned: the same error, although sample 6 sorts before 7 and 1 is fine.
    try testing.expectError(error.Io, lk.get(&.{ a, a, a }, &.{ 1, 7, 6 }, true));
    try testing.expectEqualStrings(single, status.lastMessage());
    // The lookup stays usable.
    shards[0].byte_len = saved;
    try expectGet(&env, lk, &.{ .{ .cache = 0, .sample_id = 7 }, .{ .cache = 0, .sample_id = 1 } }, false);
}

test "lookup: an unknown cache id or sample id fails with error.Index and the reference's message" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{ "plain_one_shard", "unicode_é_name" }, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    const a = env.cache_ids[0];
    const b = env.cache_ids[1];

    try testing.expectError(error.Index, lk.get(&.{123}, &.{0}, false));
    try testing.expectEqualStrings("cache_id 123 is out of range", status.lastMessage());

    try testing.expectError(error.Index, lk.get(&.{a}, &.{120}, true));
    var buf: [128]u8 = undefined;
    try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "sample_id 120 is out of range for cache_id {d}", .{a}), status.lastMessage());

    // One bad identity fails the whole call, wherever it is.
    try testing.expectError(error.Index, lk.get(&.{ a, b, b }, &.{ 0, 9, 10 }, false));
    try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "sample_id 10 is out of range for cache_id {d}", .{b}), status.lastMessage());
    try testing.expectError(error.Index, lk.get(&.{ a, std.math.maxInt(u64) }, &.{ 0, 0 }, false));
    try testing.expectEqualStrings("cache_id 18446744073709551615 is out of range", status.lastMessage());

    // The lookup stays usable.
    try expectGet(&env, lk, &.{ .{ .cache = 1, .sample_id = 9 }, .{ .cache = 0, .sample_id = 119 } }, false);
}

test "lookup: storedRows gives get's identities and stored metadata, no payloads, and get's index errors" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{ "plain_one_shard", "unicode_é_name" }, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    const a = env.cache_ids[0];
    const b = env.cache_ids[1];
    for ([_][3]u64{ .{ a, 0, 120 }, .{ a, 117, 3 }, .{ b, 2, 8 }, .{ b, 9, 0 } }) |req| {
        const cache_id, const first, const count = req;
        const view = try lk.storedRows(cache_id, first, count);
        try testing.expectEqual(count, view.count);
        const ci: usize = if (cache_id == a) 0 else 1;
        for (0..@intCast(count)) |i| {
            try testing.expectEqual(cache_id, view.cache_ids.?[i]);
            try testing.expectEqual(first + i, view.sample_ids.?[i]);
            try testing.expectEqual(@as(u64, 0), view.payload_lens.?[i]);
            try helpers.expectColumns(env.ds.fields, view, i, env.expected[ci].samples()[@intCast(first + i)].metadata);
        }
    }
    var buf: [128]u8 = undefined;
    try testing.expectError(error.Index, lk.storedRows(123, 0, 1));
    try testing.expectEqualStrings("cache_id 123 is out of range", status.lastMessage());
    try testing.expectError(error.Index, lk.storedRows(a, 120, 0));
    try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "sample_id 120 is out of range for cache_id {d}", .{a}), status.lastMessage());
    // A count past the cache's end stops there.
    try testing.expectEqual(@as(u64, 20), (try lk.storedRows(a, 100, 21)).count);
    try testing.expectEqual(@as(u64, 10), (try lk.storedRows(b, 0, std.math.maxInt(u64))).count);
    // get works as before after it (with the caller's metadata flag, kept).
    try expectGet(&env, lk, &.{ .{ .cache = 1, .sample_id = 9 }, .{ .cache = 0, .sample_id = 119 } }, false);
}

fn expectRadixSort(comptime K: type, layout: KeyLayout(K), locs: []const Loc) !void {
    const gpa = testing.allocator;
    const keys = try gpa.alloc(K, locs.len);
    defer gpa.free(keys);
    const scratch = try gpa.alloc(K, locs.len);
    defer gpa.free(scratch);
    for (keys, locs, 0..) |*k, loc, i| k.* = layout.keyOf(loc, i);
    const want = try gpa.dupe(K, keys);
    defer gpa.free(want);
    // Identity, then position: a stable sort by identity.
    std.sort.pdq(K, want, {}, std.sort.asc(K));
    for (0..2) |_| { // the second time sorted already
        const sorted = switch (Lookup.radixSort(K, keys, scratch, layout.position_bits)) {
            .keys => keys,
            .scratch => scratch,
        };
        try testing.expectEqualSlices(K, want, sorted);
        if (sorted.ptr != keys.ptr) @memcpy(keys, sorted);
    }
    for (want, 0..) |k, j| {
        const i = layout.positionOf(k);
        try testing.expectEqual(locs[i], layout.locOf(layout.identityOf(k)));
        if (j > 0) try testing.expect(layout.identityOf(want[j - 1]) <= layout.identityOf(k));
    }
}

test "lookup: the radix sort orders keys like a comparison sort, stable per identity, in 64 and 128 bits" {
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(5);
    const r = prng.random();
    // Narrow and wide sample ids, several caches, many repeats, a single identity.
    for ([_]u64{ 0, 1, 300, 1 << 20, 1 << 40, std.math.maxInt(u64) }) |sid_max| {
        for ([_]u32{ 1, 3, 70000 }) |cache_max| {
            for ([_]usize{ 2, 3, 100, 5000 }) |n| {
                const locs = try gpa.alloc(Loc, n);
                defer gpa.free(locs);
                for (locs) |*loc| loc.* = .{ .cache = r.uintLessThan(u32, cache_max), .sample_id = r.uintAtMost(u64, sid_max) };
                try expectRadixSort(u128, .{ .position_bits = 32, .sample_id_bits = 64 }, locs);
                // The narrow layout a lookup picks when it fits.
                const position_bits = bitsFor(n - 1);
                const sample_id_bits = bitsFor(sid_max);
                if (@as(u8, position_bits) + sample_id_bits + bitsFor(cache_max - 1) <= 64) {
                    try expectRadixSort(u64, .{ .position_bits = @intCast(position_bits), .sample_id_bits = @intCast(sample_id_bits) }, locs);
                }
                // Sorted input, and one identity repeated.
                std.sort.pdq(Loc, locs, {}, struct {
                    fn lt(_: void, a: Loc, b: Loc) bool {
                        return a.cache < b.cache or (a.cache == b.cache and a.sample_id < b.sample_id);
                    }
                }.lt);
                try expectRadixSort(u128, .{ .position_bits = 32, .sample_id_bits = 64 }, locs);
                @memset(locs, locs[0]);
                try expectRadixSort(u128, .{ .position_bits = 32, .sample_id_bits = 64 }, locs);
            }
        }
    }
}

test "lookup: getRow packs get's sample (payload, every field) and reports the size it needs" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    const fields = env.ds.fields;
    var buf: [4096]u8 = undefined;
    for (env.ds.caches, 0..) |*c, ci| {
        var sid: u64 = 0;
        while (sid < c.sampleCount()) : (sid += 37) {
            const want = env.expected[ci].samples()[@intCast(sid)];
            // Too small: only the size.
            @memset(buf[0..16], 0xaa);
            const size = try lk.getRow(env.cache_ids[ci], sid, buf[0..8]);
            try testing.expect(size > 16);
            try testing.expectEqual(size, std.mem.readInt(u64, buf[0..8], .little));
            try testing.expectEqual(@as(u8, 0xaa), buf[8]);
            try testing.expectEqual(size, try lk.getRow(env.cache_ids[ci], sid, &buf));
            try testing.expectEqual(size, std.mem.readInt(u64, buf[0..8], .little));
            const payload_len = std.mem.readInt(u64, buf[8..16], .little);
            try testing.expectEqual(want.len, payload_len);
            var at: usize = 16 + 8 * fields.len;
            var digest: [32]u8 = undefined;
            std.crypto.hash.sha2.Sha256.hash(buf[at..][0..@intCast(payload_len)], &digest, .{});
            try testing.expectEqualStrings(want.sha256, &std.fmt.bytesToHex(digest, .lower));
            at += @intCast(payload_len);
            for (fields, 0..) |f, fi| {
                const slot = buf[16 + 8 * fi ..][0..8];
                const value = want.metadata.object.get(f.name).?;
                switch (f.kind) {
                    .bool => try testing.expectEqual(@as(u64, @intFromBool(value.bool)), std.mem.readInt(u64, slot, .little)),
                    .int => try testing.expectEqual(value.integer, std.mem.readInt(i64, slot, .little)),
                    .float => {
                        const w: f64 = switch (value) {
                            .float => |x| x,
                            .integer => |x| @floatFromInt(x),
                            else => return error.TestUnexpectedResult,
                        };
                        try testing.expectEqual(@as(u64, @bitCast(w)), std.mem.readInt(u64, slot, .little));
                    },
                    .string => {
                        const len: usize = @intCast(std.mem.readInt(u64, slot, .little));
                        try testing.expectEqualStrings(value.string, buf[at..][0..len]);
                        at += len;
                    },
                }
            }
            try testing.expectEqual(size, @as(u64, at));
        }
    }
    // get's errors.
    try testing.expectError(error.Index, lk.getRow(123, 0, &buf));
    try testing.expectEqualStrings("cache_id 123 is out of range", status.lastMessage());
}

test "lookup: getRow's mapped path packs the bytes of the batch path, one read per call" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    const direct = try gpa.alloc(u8, 1 << 20);
    defer gpa.free(direct);
    const batched = try gpa.alloc(u8, 1 << 20);
    defer gpa.free(batched);
    for (env.ds.caches, 0..) |*c, ci| {
        var sid: u64 = 0;
        while (sid < c.sampleCount()) : (sid += 7) {
            const before = env.ds.ioStats().lookup_reads;
            const size = try lk.getRow(env.cache_ids[ci], sid, direct);
            try testing.expect(size <= direct.len);
            try testing.expectEqual(before + 1, env.ds.ioStats().lookup_reads);
            // validate_cache sends every record through `get` (and checks it against
            // metadata.arrow on the way).
            env.ds.options.validate_cache = true;
            defer env.ds.options.validate_cache = false;
            try testing.expectEqual(size, try lk.getRow(env.cache_ids[ci], sid, batched));
            try testing.expectEqualSlices(u8, batched[0..@intCast(size)], direct[0..@intCast(size)]);
        }
    }
    // The cache of the last identity never answers for another one.
    try testing.expectError(error.Index, lk.getRow(env.cache_ids[0], env.ds.caches[0].sampleCount(), direct));
    try testing.expectError(error.Index, lk.getRow(123, 0, direct));
    try testing.expectEqualStrings("cache_id 123 is out of range", status.lastMessage());
}

test "lookup: getRegisteredRow packs getRow's bytes into the registered buffer, and needs one" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    var buf: [4096]u8 = undefined;
    try testing.expectError(error.InvalidArgument, lk.getRegisteredRow(env.cache_ids[0], 0));
    try testing.expectEqualStrings("drt_lookup_row needs a row buffer: call drt_lookup_set_row_buffer first", status.lastMessage());
    var registered: [4096]u8 = undefined;
    lk.setRowBuffer(&registered);
    for (env.ds.caches, 0..) |*c, ci| {
        var sid: u64 = 0;
        while (sid < c.sampleCount()) : (sid += 11) {
            const size = try lk.getRow(env.cache_ids[ci], sid, &buf);
            try testing.expect(size <= buf.len);
            try testing.expectEqual(size, try lk.getRegisteredRow(env.cache_ids[ci], sid));
            try testing.expectEqualSlices(u8, buf[0..@intCast(size)], registered[0..@intCast(size)]);
        }
    }
    // Too small a buffer: only the size, as getRow.
    lk.setRowBuffer(registered[0..8]);
    const size = try lk.getRegisteredRow(env.cache_ids[0], 0);
    try testing.expect(size > 16);
    try testing.expectEqual(size, std.mem.readInt(u64, registered[0..8], .little));
    // getRow's errors.
    lk.setRowBuffer(&registered);
    try testing.expectError(error.Index, lk.getRegisteredRow(123, 0));
    try testing.expectEqualStrings("cache_id 123 is out of range", status.lastMessage());
    try testing.expectError(error.Index, lk.getRegisteredRow(env.cache_ids[0], env.ds.caches[0].sampleCount()));
    lk.setRowBuffer(&.{});
    try testing.expectError(error.InvalidArgument, lk.getRegisteredRow(env.cache_ids[0], 0));
}
