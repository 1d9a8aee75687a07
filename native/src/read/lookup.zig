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
//! within its byte budget `lookup_mapped_bytes_max`, 132 MiB), made on first use, instead of a pread
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
const index = @import("../format/index.zig");
const schema = @import("../format/schema.zig");
const metadata_json = @import("../format/metadata_json.zig");

/// A planned call with at most this many identities sorts 128-bit keys holding the
/// identity and its position (32 bits); larger calls are split into such parts.
const planned_count_max = std.math.maxInt(u32);

/// Reads shorter than this are copied from the shard's mapping (see the top comment).
const mapped_read_max = 16 << 10;

/// One positioned read of a planned call: `len` bytes at `offset` of a shard, into
/// `reads[at..]`, or left where they are in the shard's mapping (`mapped`).
const SpanRead = struct { cache: u32, shard_id: u64, offset: u64, len: u64, at: u64, mapped: ?[*]const u8 = null };

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
    /// Planned calls: the identities' sort keys, each record's place in `reads`, the
    /// coalesced reads and the bytes they read.
    keys: std.ArrayList(u128) = .empty,
    /// The radix sort's second buffer (see `sortKeys`).
    keys_scratch: std.ArrayList(u128) = .empty,
    record_at: std.ArrayList(u64) = .empty,
    /// Each identity's coalesced read (index into `span_reads`) and record length (so
    /// pass 4, in the caller's random order, never reads the index again).
    record_span: std.ArrayList(u32) = .empty,
    record_len: std.ArrayList(u64) = .empty,
    span_reads: std.ArrayList(SpanRead) = .empty,
    reads: std.ArrayList(u8) = .empty,
    /// Shard windows mapped on first small read (see the top comment).
    maps: files_mod.Maps = .{ .random = true, .budget = files_mod.lookup_mapped_bytes_max },
    /// Mapped reads so far (each one's stamp in `maps`), and the count when the current
    /// call started: windows used since then are pinned.
    map_stamp: u64 = 0,
    call_stamp: u64 = 0,
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

    pub fn open(ds: *Dataset) status.Error!*Lookup {
        try ds.runtime.checkPid();
        const gpa = ds.gpa;
        var batch = try batch_mod.Buffers.init(gpa, ds.fields.len);
        errdefer batch.deinit(gpa);
        const values = try gpa.alloc(schema.Value, ds.fields.len);
        errdefer gpa.free(values);
        const lk = try gpa.create(Lookup);
        lk.* = .{ .ds = ds.retain(), .batch = batch, .values = values };
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
        const rec = try shard.split(bytes);
        lk.scratch.clearRetainingCapacity();
        const diag = &lk.diag;
        metadata_json.parseRecord(rec.json, ds.fields, lk.values, &lk.scratch, ds.gpa, diag) catch |err| switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            // The messages of batch.zig's addParsed.
            error.Invalid => return switch (diag.kind) {
                .json => status.fail(error.Json, "JSON error: {s}", .{diag.message()}),
                .invalid_cache => status.failText(error.InvalidCache, diag.message()),
            },
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
        const c = &ds.caches[loc.cache];
        const row = c.row(loc.sample_id);
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
        if (len >= mapped_read_max) return null;
        const ds = lk.ds;
        if (ds.caches[cache].readsRanges(shard_id, .lookup)) return null; // see readAt
        const shard_len = ds.caches[cache].manifest.shards[@intCast(shard_id)].byte_len;
        lk.map_stamp += 1;
        return lk.maps.get(ds.gpa, .{ .cache = cache, .shard_id = shard_id }, shard_len, offset, len, &lk.files, Dataset.ShardOpener{ .ds = ds }, .{
            .now = lk.map_stamp,
            .pinned_from = lk.call_stamp,
            .resident_only = false,
        });
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
            const rec = try shard.split(lk.record.items);
            try lk.jsons.append(gpa, .{ lk.raw.items.len, rec.json.len });
            try lk.raw.appendSlice(gpa, rec.json);
            const payload_at = lk.raw.items.len;
            switch (ds.caches[loc.cache].manifest.shards[@intCast(row.shard_id)].compression) {
                .none => try lk.raw.appendSlice(gpa, rec.stored_payload),
                .lz4 => _ = try record.appendDecompressed(&lk.raw, gpa, rec.stored_payload),
            }
            try lk.spans.append(gpa, .{ payload_at, lk.raw.items.len - payload_at });
        }
        return lk.finishBatch(contiguous, false);
    }

    /// Pass 2 of both paths: parse and batch in the caller's order, now that `raw` (and
    /// the planned reads) no longer move. `jsons` and `spans` hold (start, len) in `raw`;
    /// with `absolute` (planned calls), `jsons` and the `spans` whose length has the
    /// `in_reads` bit hold addresses instead (bytes left where they were read or mapped).
    fn finishBatch(lk: *Lookup, contiguous: bool, absolute: bool) status.Error!batch_mod.View {
        const ds = lk.ds;
        const gpa = ds.gpa;
        const n = lk.locs.items.len;
        std.debug.assert(lk.jsons.items.len == n and lk.spans.items.len == n);
        const raw = lk.raw.items;
        try lk.batch.reset(gpa, ds.fields);
        const locs = lk.locs.items;
        const jsons = lk.jsons.items;
        const spans = lk.spans.items;
        var i: usize = 0;
        while (i < n) {
            if (lk.batch.stored_metadata) {
                // Stored metadata: in runs (`Buffers.addStoredRun`), a step of samples at
                // a time; a sample it leaves (a null in its row) goes through `add`.
                var payloads: [run_step][]const u8 = undefined;
                const step = @min(run_step, n - i);
                for (payloads[0..step], i..) |*payload, k| payload.* = payloadOf(raw, jsons[k], spans[k], absolute);
                const added = try lk.batch.addStoredRun(ds, locs[i..][0..step], payloads[0..step]);
                if (added > 0) {
                    i += added;
                    continue;
                }
            } else if (i + prefetch_distance < n) lk.batch.prefetch(ds, locs[i + prefetch_distance]);
            try lk.batch.add(ds, locs[i], jsonOf(raw, jsons[i], absolute), payloadOf(raw, jsons[i], spans[i], absolute));
            i += 1;
        }
        std.debug.assert(lk.raw.items.ptr == raw.ptr and lk.raw.items.len == raw.len);
        if (contiguous) try lk.batch.pack(gpa, 0);
        return lk.batch.view(ds.fields, contiguous);
    }

    /// A sample's JSON in `finishBatch`: (start, len) in `raw`, or an address with `absolute`.
    fn jsonOf(raw: []const u8, j: [2]u64, absolute: bool) []const u8 {
        return if (absolute) at(j[0])[0..@intCast(j[1])] else raw[@intCast(j[0])..][0..@intCast(j[1])];
    }

    /// A sample's payload in `finishBatch` (see there); an empty one gets its JSON's
    /// address, as `Buffers.add` gives it.
    fn payloadOf(raw: []const u8, j: [2]u64, p: [2]u64, absolute: bool) []const u8 {
        const len: usize = @intCast(p[1] & ~in_reads);
        if (len == 0) return jsonOf(raw, j, absolute)[0..0];
        return if (p[1] & in_reads != 0) at(p[0])[0..len] else raw[@intCast(p[0])..][0..len];
    }

    /// Samples `finishBatch` hands `Buffers.addStoredRun` at a time.
    const run_step = 64;

    /// How many identities ahead a call in random order starts loading a record's bytes
    /// and its metadata.arrow values (enough to overlap several memory latencies).
    const prefetch_distance = 8;

    /// Marks a payload span of a planned call that is an address, not in `raw`.
    const in_reads: u64 = 1 << 63;

    fn at(addr: u64) [*]const u8 {
        return @ptrFromInt(@as(usize, @intCast(addr)));
    }

    fn address(bytes: []const u8) u64 {
        return @intFromPtr(bytes.ptr);
    }

    /// Several identities, planned: validated in the caller's order, then each distinct
    /// record read once, in (cache, sample id) order, adjacent records coalesced.
    fn getPlanned(lk: *Lookup, cache_ids: []const u64, sample_ids: []const u64, contiguous: bool) status.Error!batch_mod.View {
        const ds = lk.ds;
        const gpa = ds.gpa;
        const n = cache_ids.len;
        std.debug.assert(n <= planned_count_max);
        // Pass 1: identities (errors in the caller's order) and sort keys.
        lk.keys.clearRetainingCapacity();
        try lk.keys.ensureTotalCapacity(gpa, n);
        lk.locs.clearRetainingCapacity();
        try lk.locs.ensureTotalCapacity(gpa, n);
        for (cache_ids, sample_ids, 0..) |cid, sid, i| {
            const loc = try lk.locate(cid, sid);
            lk.locs.appendAssumeCapacity(loc);
            lk.keys.appendAssumeCapacity(@as(u128, loc.cache) << 96 | @as(u128, sid) << 32 | @as(u128, @intCast(i)));
        }
        try lk.sortKeys();
        // Pass 2: plan the reads: one per run of adjacent records of one shard.
        try lk.record_at.ensureTotalCapacity(gpa, n);
        lk.record_at.items.len = n; // every entry is set below
        const record_at = lk.record_at.items;
        try lk.record_span.ensureTotalCapacity(gpa, n);
        lk.record_span.items.len = n; // every entry is set below
        const record_span = lk.record_span.items;
        try lk.record_len.ensureTotalCapacity(gpa, n);
        lk.record_len.items.len = n; // every entry is set below
        const record_len = lk.record_len.items;
        var previous_len: u64 = 0;
        lk.span_reads.clearRetainingCapacity();
        var total: u64 = 0;
        var previous: ?u128 = null;
        var previous_at: u64 = 0;
        for (lk.keys.items) |key| {
            const i: usize = @intCast(key & std.math.maxInt(u32));
            const identity = key >> 32;
            if (previous != null and previous.? == identity) {
                record_at[i] = previous_at; // the same record again: read once
                record_span[i] = @intCast(lk.span_reads.items.len - 1);
                record_len[i] = previous_len;
                continue;
            }
            previous = identity;
            const loc: Loc = .{ .cache = @intCast(identity >> 64), .sample_id = @truncate(identity) };
            const row = try checkRow(ds, loc);
            const last = if (lk.span_reads.items.len > 0) &lk.span_reads.items[lk.span_reads.items.len - 1] else null;
            if (last != null and last.?.cache == loc.cache and last.?.shard_id == row.shard_id and
                last.?.offset + last.?.len == row.offset and last.?.len < plan.coalesce_bytes_max)
            {
                last.?.len += row.byte_len;
            } else {
                try lk.span_reads.append(gpa, .{ .cache = loc.cache, .shard_id = row.shard_id, .offset = row.offset, .len = row.byte_len, .at = total });
            }
            previous_at = total;
            record_at[i] = total;
            record_span[i] = @intCast(lk.span_reads.items.len - 1);
            record_len[i] = row.byte_len;
            previous_len = row.byte_len;
            total += row.byte_len;
        }
        // Pass 3: read (the buffer is sized once, so it never moves afterwards); small
        // spans stay in the shard's mapping.
        try record.growUninit(&lk.reads, gpa, @intCast(total));
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
        // Pass 4: split each record in the caller's order; LZ4 payloads into `raw`.
        const reads = lk.reads.items;
        lk.raw.clearRetainingCapacity();
        lk.spans.clearRetainingCapacity();
        lk.jsons.clearRetainingCapacity();
        try lk.spans.ensureTotalCapacity(gpa, n);
        try lk.jsons.ensureTotalCapacity(gpa, n);
        const span_reads = lk.span_reads.items;
        for (lk.locs.items, record_at, record_span, record_len, 0..) |loc, record_start, si, byte_len, i| {
            // Random order: start loading the record a few identities ahead.
            if (i + prefetch_distance < n) {
                const ahead = span_reads[record_span[i + prefetch_distance]];
                const ahead_base: [*]const u8 = ahead.mapped orelse reads[@intCast(ahead.at)..].ptr;
                @prefetch(ahead_base + @as(usize, @intCast(record_at[i + prefetch_distance] - ahead.at)), .{});
            }
            const c = &ds.caches[loc.cache];
            const s = span_reads[si];
            const within: usize = @intCast(record_start - s.at);
            const base: [*]const u8 = s.mapped orelse reads[@intCast(s.at)..].ptr;
            const bytes = base[within..][0..@intCast(byte_len)];
            const rec = try shard.split(bytes);
            lk.jsons.appendAssumeCapacity(.{ address(rec.json), rec.json.len });
            switch (c.manifest.shards[@intCast(s.shard_id)].compression) {
                .none => lk.spans.appendAssumeCapacity(.{ address(rec.stored_payload), rec.stored_payload.len | in_reads }),
                .lz4 => {
                    const payload_at = lk.raw.items.len;
                    const len = try record.appendDecompressed(&lk.raw, gpa, rec.stored_payload);
                    lk.spans.appendAssumeCapacity(.{ payload_at, len });
                },
            }
        }
        std.debug.assert(lk.reads.items.ptr == reads.ptr);
        return lk.finishBatch(contiguous, true);
    }

    /// Sorts `keys` (cache << 96 | sample id << 32 | position) by identity: nothing to
    /// do when they are in order already (a caller's sorted request), else a stable
    /// least-significant-digit radix sort over the bytes that differ (those of the
    /// largest sample id and cache index asked for: 3 passes for a cache of 10M samples),
    /// which is several times faster than a comparison sort of 128-bit keys. Positions
    /// of one identity keep their order (nothing depends on it).
    fn sortKeys(lk: *Lookup) status.Error!void {
        const keys = lk.keys.items;
        var sorted = true;
        var all: u128 = 0; // the bits set in any identity
        for (keys, 0..) |k, j| {
            all |= k;
            if (j > 0 and keys[j - 1] >> 32 > k >> 32) sorted = false;
        }
        if (sorted) return;
        try lk.keys_scratch.ensureTotalCapacity(lk.ds.gpa, keys.len);
        lk.keys_scratch.items.len = keys.len;
        var src = keys;
        var dst = lk.keys_scratch.items;
        var counts: [256]u32 = undefined;
        var shift: u7 = 32; // the position (low 32 bits) is not sorted on
        while (true) : (shift += 8) {
            if (all >> shift == 0) break;
            if ((all >> shift) & 0xff != 0) {
                @memset(&counts, 0);
                for (src) |k| counts[@as(u8, @truncate(k >> shift))] += 1;
                var sum: u32 = 0;
                for (&counts) |*c| {
                    const here = c.*;
                    c.* = sum;
                    sum += here;
                }
                for (src) |k| {
                    const d: u8 = @truncate(k >> shift);
                    dst[counts[d]] = k;
                    counts[d] += 1;
                }
                std.mem.swap([]u128, &src, &dst);
            }
            if (shift == 120) break;
        }
        if (src.ptr != keys.ptr) @memcpy(keys, src);
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
        lk.locs.deinit(gpa);
        lk.keys.deinit(gpa);
        lk.keys_scratch.deinit(gpa);
        lk.record_at.deinit(gpa);
        lk.record_span.deinit(gpa);
        lk.record_len.deinit(gpa);
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

    for ([_]bool{ false, true }) |contiguous| {
        for ([_][]const Loc{ in_order, reversed, &random, &few, few[0..1] }) |locs| {
            const before = env.ds.ioStats().lookup_reads;
            try expectGet(&env, lk, locs, contiguous);
            // At most one read per distinct record, counted as lookup reads.
            const reads = env.ds.ioStats().lookup_reads - before;
            try testing.expect(reads >= 1 and reads <= locs.len);
        }
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

test "lookup: the radix sort orders keys like a comparison sort, stable per identity" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{"plain_one_shard"}, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    var prng = std.Random.DefaultPrng.init(5);
    const r = prng.random();
    // Narrow and wide sample ids, several caches, many repeats; already sorted input.
    for ([_]u64{ 1, 300, 1 << 20, 1 << 40, std.math.maxInt(u64) }) |sid_max| {
        for ([_]u32{ 1, 3, 70000 }) |cache_max| {
            for ([_]usize{ 2, 100, 5000 }) |n| {
                lk.keys.clearRetainingCapacity();
                for (0..n) |i| {
                    const cache = r.uintLessThan(u32, cache_max);
                    const sid = r.uintAtMost(u64, sid_max);
                    try lk.keys.append(gpa, @as(u128, cache) << 96 | @as(u128, sid) << 32 | @as(u128, @intCast(i)));
                }
                const want = try gpa.dupe(u128, lk.keys.items);
                defer gpa.free(want);
                std.sort.pdq(u128, want, {}, std.sort.asc(u128));
                try lk.sortKeys();
                try testing.expectEqualSlices(u128, want, lk.keys.items);
                try lk.sortKeys(); // sorted already
                try testing.expectEqualSlices(u128, want, lk.keys.items);
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
