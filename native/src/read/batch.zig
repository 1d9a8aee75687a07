//! Building one batch of samples for the caller: identities, payload pointers (or one
//! contiguous arena), and one typed column per schema field. Iterators and lookups both
//! hand out batches built here.
//!
//! Where the metadata columns come from (`Buffers.stored_metadata`):
//! - false (per-sample reads, the reference's behaviour): each record's embedded JSON,
//!   parsed against the schema (JSON nulls, how the reference stores NaN and infinities,
//!   resolved from `metadata.arrow`).
//! - true (batch APIs): the cache's `metadata.arrow` as written (physical row =
//!   sample id; never the active table, which `update_metadata` may have edited),
//!   gathered from the mapped file without parsing any JSON. The values are those the
//!   embedded JSON holds for every cache a writer produced (the writer derives both
//!   from one dict). A row with an Arrow null in a field (never written by a writer)
//!   falls back to the embedded JSON. With `validate_cache` the JSON is still parsed
//!   and compared with the row (the per-sample path), so errors are the same.
//!   `metadata.arrow` is mapped and parsed per cache on first use (`Cache.metadataFile`),
//!   never copied.
//!
//! Invariants:
//! - Every array of a batch has `count` entries (string columns `count + 1` offsets).
//! - A view's pointers stay valid until the next `reset` (the next call on the handle).
//! - With `validate_cache`, every sample's parsed values equal its `metadata.arrow` row.

const std = @import("std");
const mem_mod = @import("../base/mem.zig");
const builtin = @import("builtin");
const status = @import("../base/status.zig");
const schema = @import("../format/schema.zig");
const metadata_json = @import("../format/metadata_json.zig");
const arrow = @import("../format/arrow.zig");
const dataset_mod = @import("dataset.zig");
const Dataset = dataset_mod.Dataset;
const Loc = dataset_mod.Loc;

/// One column of a batch view: bool values as bytes, int64, float64, or string bytes
/// with `count + 1` offsets.
pub const ColumnView = struct {
    kind: schema.Kind,
    values: ?*const anyopaque,
    offsets: ?[*]const u64,
};

/// What a batch hands out (the C layer lays it out as `drt_batch`). An empty view
/// (count 0) marks the end of an iterator.
pub const View = struct {
    count: u64 = 0,
    payloads: ?[*]const [*]const u8 = null,
    payload_lens: ?[*]const u64 = null,
    /// Set only for a contiguous batch: every payload is `payload_base[offset..][0..len]`.
    payload_base: ?[*]const u8 = null,
    payload_offsets: ?[*]const u64 = null,
    cache_ids: ?[*]const u64 = null,
    sample_ids: ?[*]const u64 = null,
    columns: []const ColumnView = &.{},
};

/// The address of the empty payloads of `Buffers.addStoredRows`.
const no_bytes = [1]u8{0};

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

/// The arrays behind one batch, reused from batch to batch.
pub const Buffers = struct {
    payloads: std.ArrayList([*]const u8) = .empty,
    payload_lens: std.ArrayList(u64) = .empty,
    payload_offsets: std.ArrayList(u64) = .empty,
    arena: std.ArrayList(u8) = .empty,
    cache_ids: std.ArrayList(u64) = .empty,
    sample_ids: std.ArrayList(u64) = .empty,
    columns: []ColumnBuffer = &.{},
    views: []ColumnView = &.{},
    values: []schema.Value = &.{},
    scratch: std.ArrayList(u8) = .empty,
    /// `addParsed`'s parse diagnostics, read only after a parse failed (which sets it):
    /// kept here so a sample does not initialize its 256-byte message buffer (safe
    /// builds fill `undefined` memory).
    diag: metadata_json.Diagnostic = .{},
    /// Take metadata columns from `metadata.arrow` instead of the embedded JSON (see
    /// //!). Set by the caller before a batch call; kept across `reset`.
    stored_metadata: bool = false,
    /// An iterator's contiguous batch stops taking samples once its payloads reach the
    /// reader's byte budget (`DRT_BATCH_BOUNDED`). Set by the caller before a batch call;
    /// kept across `reset`.
    bounded: bool = false,
    /// The `metadata.arrow` record batch of the last stored row: rows
    /// `[stored_first, stored_end)` of cache `stored_cache` (consecutive samples of a
    /// batch nearly always share it, so the batch search runs once per record batch).
    stored_cache: u32 = std.math.maxInt(u32),
    stored_first: u64 = 0,
    stored_end: u64 = 0,
    stored_columns: []const arrow.Column = &.{},
    /// A contiguous batch's payloads go to the caller's memory `dest` while they fit
    /// (`in_dest`; `dest_used` bytes taken), else to `arena` (see `into`).
    dest: []u8 = &.{},
    dest_used: usize = 0,
    in_dest: bool = false,

    pub fn init(gpa: std.mem.Allocator, field_count: usize) status.Error!Buffers {
        var b: Buffers = .{};
        b.columns = try gpa.alloc(ColumnBuffer, field_count);
        errdefer gpa.free(b.columns);
        @memset(b.columns, .{});
        b.views = try gpa.alloc(ColumnView, field_count);
        errdefer gpa.free(b.views);
        b.values = try gpa.alloc(schema.Value, field_count);
        return b;
    }

    pub fn deinit(b: *Buffers, gpa: std.mem.Allocator) void {
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

    pub fn reset(b: *Buffers, gpa: std.mem.Allocator, fields: []const schema.Field) status.Error!void {
        std.debug.assert(fields.len == b.columns.len);
        b.payloads.clearRetainingCapacity();
        b.payload_lens.clearRetainingCapacity();
        b.payload_offsets.clearRetainingCapacity();
        b.arena.clearRetainingCapacity();
        b.cache_ids.clearRetainingCapacity();
        b.sample_ids.clearRetainingCapacity();
        b.dest = &.{};
        b.dest_used = 0;
        b.in_dest = false;
        for (b.columns, fields) |*c, f| {
            c.bytes.clearRetainingCapacity();
            c.ints.clearRetainingCapacity();
            c.floats.clearRetainingCapacity();
            c.offsets.clearRetainingCapacity();
            if (f.kind == .string) try c.offsets.append(gpa, 0);
        }
    }

    /// Appends one sample: its metadata (the embedded JSON parsed, resolving JSON nulls
    /// and, with validate_cache, compared with metadata.arrow; or with `stored_metadata`
    /// the metadata.arrow row) and its payload. `payload` must stay where it is until the
    /// batch is handed out or packed.
    pub fn add(b: *Buffers, ds: *Dataset, loc: Loc, json: []const u8, payload: []const u8) status.Error!void {
        const gpa = ds.gpa;
        if (!(b.stored_metadata and !ds.options.validate_cache and try b.addStored(ds, loc))) {
            try b.addParsed(ds, loc, json);
        }
        // An empty slice's pointer is arbitrary; give empty payloads a real address.
        try b.payloads.append(gpa, if (payload.len == 0) json.ptr else payload.ptr);
        try b.payload_lens.append(gpa, payload.len);
        try b.cache_ids.append(gpa, ds.caches[loc.cache].cache_id);
        try b.sample_ids.append(gpa, loc.sample_id);
    }

    /// Starts loading what `add` will read of `loc`'s metadata.arrow row (stored
    /// metadata, when its record batch is the current one): a hint, no effect on results.
    pub fn prefetch(b: *const Buffers, ds: *const Dataset, loc: Loc) void {
        if (!b.stored_metadata or ds.options.validate_cache) return;
        if (loc.cache != b.stored_cache or loc.sample_id < b.stored_first or loc.sample_id >= b.stored_end) return;
        prefetchRow(b.stored_columns, loc.sample_id - b.stored_first);
    }

    /// Starts loading row `row` of `columns` (a hint).
    inline fn prefetchRow(columns: []const arrow.Column, row64: u64) void {
        const row: usize = @intCast(row64);
        for (columns) |col| {
            switch (col.type) {
                .bool => @prefetch(col.values.ptr + row / 8, .{}),
                .int64, .float64 => @prefetch(col.values.ptr + row * 8, .{}),
                .utf8 => @prefetch(col.offsets.ptr + row * 4, .{}),
                .large_utf8 => @prefetch(col.offsets.ptr + row * 8, .{}),
                .other => {},
            }
        }
    }

    /// The metadata.arrow columns and row index of a sample.
    fn storedRow(b: *Buffers, ds: *Dataset, loc: Loc) status.Error!struct { []const arrow.Column, u64 } {
        if (loc.cache != b.stored_cache or loc.sample_id < b.stored_first or loc.sample_id >= b.stored_end) {
            const md = try ds.caches[loc.cache].metadataFile();
            const at = md.locate(loc.sample_id);
            const rb = md.batches[at.batch];
            b.stored_cache = loc.cache;
            b.stored_first = rb.first_row;
            b.stored_end = rb.first_row + rb.length;
            b.stored_columns = rb.columns[0..ds.fields.len];
        }
        return .{ b.stored_columns, loc.sample_id - b.stored_first };
    }

    /// Appends a sample's metadata.arrow row to the columns; false (nothing appended)
    /// when the row holds a null (then the embedded JSON is the value).
    fn addStored(b: *Buffers, ds: *Dataset, loc: Loc) status.Error!bool {
        const gpa = ds.gpa;
        const columns, const row = try b.storedRow(ds, loc);
        for (columns) |col| if (col.null_count > 0 and col.isNull(row)) return false;
        for (columns, b.columns, ds.fields) |col, *out, f| {
            switch (f.kind) {
                .bool => try out.bytes.append(gpa, @intFromBool(col.getBool(row))),
                .int => try out.ints.append(gpa, col.getInt(row)),
                .float => try out.floats.append(gpa, col.getFloat(row)),
                .string => {
                    try out.bytes.appendSlice(gpa, col.getString(row));
                    try out.offsets.append(gpa, out.bytes.items.len);
                },
            }
        }
        return true;
    }

    /// Appends a sample's embedded JSON, parsed, to the columns.
    fn addParsed(b: *Buffers, ds: *Dataset, loc: Loc, json: []const u8) status.Error!void {
        const gpa = ds.gpa;
        b.scratch.clearRetainingCapacity();
        const diag = &b.diag;
        metadata_json.parseRecord(json, ds.fields, b.values, &b.scratch, gpa, diag) catch |err| switch (err) {
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
            const columns, const row = try b.storedRow(ds, loc);
            for (b.values, 0..) |*v, fi| {
                if (v.* == .null) v.* = .{ .float = columns[fi].getFloat(row) };
            }
            if (ds.options.validate_cache and !matchesRow(ds.fields, b.values, columns, row)) {
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
    }

    pub fn count(b: *const Buffers) u64 {
        return b.cache_ids.items.len;
    }

    /// Room for `n` more samples in every per-sample array (string bytes excepted).
    pub fn reserve(b: *Buffers, gpa: std.mem.Allocator, fields: []const schema.Field, n: usize) status.Error!void {
        try b.payloads.ensureUnusedCapacity(gpa, n);
        try b.payload_lens.ensureUnusedCapacity(gpa, n);
        try b.payload_offsets.ensureUnusedCapacity(gpa, n);
        try b.cache_ids.ensureUnusedCapacity(gpa, n);
        try b.sample_ids.ensureUnusedCapacity(gpa, n);
        for (b.columns, fields) |*c, f| switch (f.kind) {
            .bool => try c.bytes.ensureUnusedCapacity(gpa, n),
            .int => try c.ints.ensureUnusedCapacity(gpa, n),
            .float => try c.floats.ensureUnusedCapacity(gpa, n),
            .string => try c.offsets.ensureUnusedCapacity(gpa, n),
        };
    }

    /// After `reset`: the contiguous batch's payloads go to `dest` (the caller's memory)
    /// while they all fit; the first payload that does not fit moves those already there
    /// into the arena, which holds the whole batch from then on.
    pub fn into(b: *Buffers, dest: []u8) void {
        std.debug.assert(b.count() == 0);
        b.dest = dest;
        b.dest_used = 0;
        b.in_dest = dest.len > 0;
    }

    /// Where the contiguous payloads are: `dest` or the arena.
    fn payloadBase(b: *const Buffers) [*]u8 {
        return if (b.in_dest) b.dest.ptr else b.arena.items.ptr;
    }

    /// Bytes of contiguous payloads so far.
    pub fn payloadBytes(b: *const Buffers) usize {
        return if (b.in_dest) b.dest_used else b.arena.items.len;
    }

    /// `n` more bytes at the end of the contiguous payloads (in `dest` while they fit,
    /// else in the arena, which always has a real address). Earlier slices may move.
    fn claim(b: *Buffers, gpa: std.mem.Allocator, n: usize) status.Error![]u8 {
        if (b.in_dest) {
            if (b.dest.len - b.dest_used >= n) {
                const s = b.dest[b.dest_used..][0..n];
                b.dest_used += n;
                return s;
            }
            // Larger than the caller foresaw: the whole batch goes to the arena.
            try b.arena.ensureTotalCapacity(gpa, b.dest_used + n);
            b.arena.appendSliceAssumeCapacity(b.dest[0..b.dest_used]);
            b.in_dest = false;
        }
        try b.arena.ensureUnusedCapacity(gpa, @max(n, 1)); // a real address even for no bytes
        const at = b.arena.items.len;
        b.arena.items.len += n;
        return b.arena.items[at..][0..n];
    }

    /// Copies the payloads of samples `first..` into the contiguous payloads (their
    /// source buffers can then be reused) and records their offsets.
    pub fn pack(b: *Buffers, gpa: std.mem.Allocator, first: u64) status.Error!void {
        const start: usize = @intCast(first);
        std.debug.assert(b.payload_offsets.items.len == start);
        var total: usize = 0;
        for (b.payload_lens.items[start..]) |n| total += @intCast(n);
        try b.payload_offsets.ensureUnusedCapacity(gpa, b.payloads.items.len - start);
        const space = try b.claim(gpa, total);
        var at = b.payloadBytes() - total;
        for (b.payload_lens.items[start..]) |n| {
            b.payload_offsets.appendAssumeCapacity(at);
            at += @intCast(n);
        }
        gatherPayloads(space, b.payloads.items[start..], b.payload_lens.items[start..]);
    }

    /// `add` for a contiguous batch: the payload is copied into the contiguous payloads
    /// at once (its source may be reused after the call).
    pub fn addCopy(b: *Buffers, ds: *Dataset, loc: Loc, json: []const u8, payload: []const u8) status.Error!void {
        std.debug.assert(b.payload_offsets.items.len == b.count());
        try b.payload_offsets.ensureUnusedCapacity(ds.gpa, 1);
        const space = try b.claim(ds.gpa, payload.len);
        errdefer b.unclaim(payload.len);
        @memcpy(space, payload);
        try b.add(ds, loc, json, space);
        b.payload_offsets.appendAssumeCapacity(b.payloadBytes() - payload.len);
    }

    /// `addCopy` in bulk for `payloads.len` samples of cache `cache` with consecutive
    /// sample ids from `first` (stored metadata only, without `validate_cache`): their
    /// `metadata.arrow` rows are appended column by column (one copy per int and float
    /// column, one per string column's bytes) and their payloads copied back to back.
    /// Returns the samples added: a prefix of the run, up to the end of the first row's
    /// record batch and before the first row holding a null (0 when the first does, or
    /// when batches parse the embedded JSON: the caller adds those with `addCopy`, which
    /// gives the same values and errors). Nothing is added when it fails.
    ///
    /// With `in_place`, the payloads already lie back to back in `dest` where the batch's
    /// next payload bytes go (read there: `Iter.takeStaged`): they are claimed there, not
    /// copied, and nothing is added when they are not there.
    pub fn addRun(b: *Buffers, ds: *Dataset, cache: u32, first: u64, payloads: []const []const u8, in_place: bool) status.Error!usize {
        if (!b.stored_metadata or ds.options.validate_cache or payloads.len == 0) return 0;
        if (in_place and (!b.in_dest or payloads[0].ptr != b.dest.ptr + b.dest_used)) return 0;
        const gpa = ds.gpa;
        std.debug.assert(b.payload_offsets.items.len == b.count());
        const columns, const row = try b.storedRow(ds, .{ .cache = cache, .sample_id = first });
        const n = nullFreeRows(columns, row, @intCast(@min(payloads.len, b.stored_end - first)));
        if (n == 0) return 0;
        var total: usize = 0;
        for (payloads[0..n]) |p| total += p.len;
        // Room first, so that nothing below fails halfway.
        try b.reserveRows(gpa, ds.fields, columns, row, n);
        const placed = if (in_place) b.claimDest(total) orelse return 0 else null;
        const space = placed orelse try b.claim(gpa, total);
        const at0 = b.payloadBytes() - total;
        b.appendRows(ds.fields, columns, row, n);
        // Each array written through its unused capacity (reserved above), its length
        // set once: no per-append capacity check.
        const cache_id = ds.caches[cache].cache_id;
        const ptrs = b.payloads.unusedCapacitySlice()[0..n];
        const lens = b.payload_lens.unusedCapacitySlice()[0..n];
        const offsets = b.payload_offsets.unusedCapacitySlice()[0..n];
        const cache_ids = b.cache_ids.unusedCapacitySlice()[0..n];
        const sample_ids = b.sample_ids.unusedCapacitySlice()[0..n];
        var at: usize = 0;
        for (payloads[0..n], ptrs, lens, offsets, cache_ids, sample_ids, first..) |p, *ptr, *len, *offset, *cache_id_out, *sample_id, id| {
            if (placed == null) @memcpy(space[at..][0..p.len], p);
            // The pointer is rebased by `view` (a contiguous batch); any real address.
            ptr.* = space.ptr;
            len.* = p.len;
            offset.* = at0 + at;
            cache_id_out.* = cache_id;
            sample_id.* = id;
            at += p.len;
        }
        b.payloads.items.len += n;
        b.payload_lens.items.len += n;
        b.payload_offsets.items.len += n;
        b.cache_ids.items.len += n;
        b.sample_ids.items.len += n;
        return n;
    }

    /// How many of the rows `row..row + n` of `columns` (a metadata.arrow record
    /// batch's) come before the first one holding a null.
    fn nullFreeRows(columns: []const arrow.Column, row: u64, n: usize) usize {
        var free = n;
        for (columns) |col| {
            if (col.null_count == 0) continue;
            for (0..free) |k| if (col.isNull(row + k)) {
                free = k;
                break;
            };
        }
        return free;
    }

    /// Room for `n` more samples (`reserve`) and for the string bytes of rows
    /// `row..row + n` of `columns`, so that `appendRows` cannot fail.
    fn reserveRows(b: *Buffers, gpa: std.mem.Allocator, fields: []const schema.Field, columns: []const arrow.Column, row: u64, n: usize) status.Error!void {
        try b.reserve(gpa, fields, n);
        for (columns, b.columns, fields) |col, *out, f| if (f.kind == .string) {
            try out.bytes.ensureUnusedCapacity(gpa, @intCast(stringEnd(col, row + n) - stringEnd(col, row)));
        };
    }

    /// Appends rows `row..row + n` of `columns` (holding no null) to the metadata
    /// columns, column by column (one copy per int and float column, one per string
    /// column's bytes). Pre: `reserveRows` for them.
    fn appendRows(b: *Buffers, fields: []const schema.Field, columns: []const arrow.Column, row: u64, n: usize) void {
        const r: usize = @intCast(row);
        for (columns, b.columns, fields) |col, *out, f| {
            switch (f.kind) {
                .bool => for (0..n) |k| out.bytes.appendAssumeCapacity(@intFromBool(col.getBool(r + k))),
                .int => appendWords(i64, &out.ints, col.values[r * 8 ..][0 .. n * 8]),
                .float => appendWords(f64, &out.floats, col.values[r * 8 ..][0 .. n * 8]),
                .string => {
                    const start = stringEnd(col, r);
                    const base = out.bytes.items.len;
                    out.bytes.appendSliceAssumeCapacity(col.values[@intCast(start)..@intCast(stringEnd(col, r + n))]);
                    appendStringEnds(&out.offsets, col, r, n, base, start);
                },
            }
        }
    }

    /// The metadata.arrow rows of samples `first..first + rows` of cache `cache` (which
    /// has them), each with its identity and an empty payload: no record is read (see
    /// `Lookup.storedRows`). Stops before the first row that holds a null (its value is
    /// the embedded JSON's). Returns the rows added. Nothing of a row is added when it
    /// fails. Pre: `stored_metadata`.
    pub fn addStoredRows(b: *Buffers, ds: *Dataset, cache: u32, first: u64, rows: u64) status.Error!u64 {
        std.debug.assert(b.stored_metadata and rows <= ds.caches[cache].sampleCount() - first);
        const gpa = ds.gpa;
        const cache_id = ds.caches[cache].cache_id;
        var added: u64 = 0;
        while (added < rows) {
            const id = first + added;
            const columns, const row = try b.storedRow(ds, .{ .cache = cache, .sample_id = id });
            const batch_rows: usize = @intCast(@min(rows - added, b.stored_end - id));
            const n = nullFreeRows(columns, row, batch_rows);
            try b.reserveRows(gpa, ds.fields, columns, row, n);
            b.appendRows(ds.fields, columns, row, n);
            for (id..id + n) |sample_id| {
                // An empty payload, at a real address (see `add`).
                b.payloads.appendAssumeCapacity(&no_bytes);
                b.payload_lens.appendAssumeCapacity(0);
                b.cache_ids.appendAssumeCapacity(cache_id);
                b.sample_ids.appendAssumeCapacity(sample_id);
            }
            added += n;
            if (n < batch_rows) break;
        }
        return added;
    }

    /// `add` in bulk for samples in any order whose payloads stay where they are
    /// (`payloads[k]` is sample `locs[k]`'s, with a real address even when empty; stored
    /// metadata only, without `validate_cache`): the leading samples whose
    /// `metadata.arrow` rows lie in the first one's record batch and hold no null, their
    /// rows gathered column by column (one kind dispatch per column, not per value; the
    /// values read through unchecked pointers, which the file's validation at open keeps
    /// in bounds: see `arrow.Column`) and every array reserved once. Returns the samples
    /// added: 0 when the first sample's row holds a null or batches parse the embedded
    /// JSON (the caller adds it with `add`, which gives the same values and errors).
    /// Nothing is added when it fails. Only `get_items` (read/lookup.zig) calls it.
    pub fn addStoredRun(b: *Buffers, ds: *Dataset, locs: []const Loc, payloads: []const []const u8) status.Error!usize {
        std.debug.assert(locs.len == payloads.len);
        if (!b.stored_metadata or ds.options.validate_cache or locs.len == 0) return 0;
        const gpa = ds.gpa;
        const columns, _ = try b.storedRow(ds, locs[0]);
        const cache = locs[0].cache;
        const first_row = b.stored_first;
        const rows = b.stored_end - first_row;
        var nullable = false;
        for (columns) |col| nullable = nullable or col.null_count > 0;
        var n: usize = 0;
        scan: while (n < locs.len) : (n += 1) {
            const loc = locs[n];
            // Below `first_row` wraps around to a row past the batch.
            const row = loc.sample_id -% first_row;
            if (loc.cache != cache or row >= rows) break;
            if (nullable) for (columns) |col| if (col.null_count > 0 and col.isNull(row)) break :scan;
        }
        if (n == 0) return 0;
        const run = locs[0..n];
        // Room first, so that nothing below fails halfway.
        try b.reserve(gpa, ds.fields, n);
        for (columns, b.columns, ds.fields) |col, *out, f| if (f.kind == .string) {
            const bytes = switch (col.type) {
                .utf8 => stringBytes(i32, col, run, first_row),
                .large_utf8 => stringBytes(i64, col, run, first_row),
                else => unreachable,
            };
            try out.bytes.ensureUnusedCapacity(gpa, @intCast(bytes));
        };
        for (columns, b.columns, ds.fields) |col, *out, f| {
            switch (f.kind) {
                .bool => for (run) |loc| out.bytes.appendAssumeCapacity(@intFromBool(col.getBool(loc.sample_id - first_row))),
                .int => gatherWords(i64, &out.ints, col, run, first_row),
                .float => gatherWords(f64, &out.floats, col, run, first_row),
                .string => switch (col.type) {
                    .utf8 => gatherStrings(i32, out, col, run, first_row),
                    .large_utf8 => gatherStrings(i64, out, col, run, first_row),
                    else => unreachable,
                },
            }
        }
        const cache_id = ds.caches[cache].cache_id;
        for (run, payloads[0..n]) |loc, p| {
            b.payloads.appendAssumeCapacity(p.ptr);
            b.payload_lens.appendAssumeCapacity(p.len);
            b.cache_ids.appendAssumeCapacity(cache_id);
            b.sample_ids.appendAssumeCapacity(loc.sample_id);
        }
        return n;
    }

    /// How many samples ahead `addStoredRun` starts loading a column's value (a hint).
    const gather_prefetch_distance = 16;

    /// Appends the 8-byte values of rows `run[k].sample_id - first_row` of `col` (int64
    /// or float64) to `list`, which has room for them.
    fn gatherWords(comptime T: type, list: *std.ArrayList(T), col: arrow.Column, run: []const Loc, first_row: u64) void {
        std.debug.assert(col.values.len >= 8 * col.len and list.unusedCapacitySlice().len >= run.len);
        const dest = list.unusedCapacitySlice()[0..run.len];
        const words: [*]align(1) const u64 = @ptrCast(col.values.ptr);
        for (dest, run, 0..) |*v, loc, k| {
            if (k + gather_prefetch_distance < run.len) @prefetch(&words[@intCast(run[k + gather_prefetch_distance].sample_id - first_row)], .{});
            const row: usize = @intCast(loc.sample_id - first_row);
            std.debug.assert(row < col.len);
            v.* = @bitCast(std.mem.littleToNative(u64, words[row]));
        }
        list.items.len += run.len;
    }

    /// The total length of the strings of rows `run[k].sample_id - first_row` of `col`
    /// (with `Offset` offsets), the offsets loaded a few rows ahead (`gatherStrings`
    /// then finds them in the CPU caches).
    fn stringBytes(comptime Offset: type, col: arrow.Column, run: []const Loc, first_row: u64) u64 {
        var bytes: u64 = 0;
        for (run, 0..) |loc, k| {
            if (k + gather_prefetch_distance < run.len) {
                @prefetch(col.offsets.ptr + @sizeOf(Offset) * @as(usize, @intCast(run[k + gather_prefetch_distance].sample_id - first_row)), .{});
            }
            bytes += stringBounds(Offset, col, loc.sample_id - first_row)[1];
        }
        return bytes;
    }

    /// Appends the strings of rows `run[k].sample_id - first_row` of `col` (with
    /// `Offset` offsets, loaded by `stringBytes`) to `out` (bytes and offsets), which has
    /// room for them; each string's bytes are loaded a few rows ahead.
    fn gatherStrings(comptime Offset: type, out: *ColumnBuffer, col: arrow.Column, run: []const Loc, first_row: u64) void {
        std.debug.assert(out.offsets.unusedCapacitySlice().len >= run.len);
        const ends = out.offsets.unusedCapacitySlice()[0..run.len];
        var used = out.bytes.items.len;
        const room = out.bytes.allocatedSlice();
        for (ends, run, 0..) |*end, loc, k| {
            if (k + gather_prefetch_distance < run.len) {
                const ahead = stringBounds(Offset, col, run[k + gather_prefetch_distance].sample_id - first_row)[0];
                @prefetch(col.values.ptr + ahead, .{});
            }
            const start, const len = stringBounds(Offset, col, loc.sample_id - first_row);
            @memcpy(room[used..][0..len], col.values.ptr[start..][0..len]);
            used += len;
            end.* = used;
        }
        out.bytes.items.len = used;
        out.offsets.items.len += run.len;
    }

    /// (start, length) of row `row`'s string in `col.values`; the offsets were checked
    /// (in bounds, monotonic) when the file was opened.
    inline fn stringBounds(comptime Offset: type, col: arrow.Column, row: u64) [2]usize {
        std.debug.assert(row < col.len and col.offsets.len >= @sizeOf(Offset) * (col.len + 1));
        const offsets: [*]align(1) const Offset = @ptrCast(col.offsets.ptr);
        const r: usize = @intCast(row);
        const start: usize = @intCast(std.mem.littleToNative(Offset, offsets[r]));
        const end: usize = @intCast(std.mem.littleToNative(Offset, offsets[r + 1]));
        std.debug.assert(start <= end and end <= col.values.len);
        return .{ start, end - start };
    }

    /// `n` more bytes of the caller's `dest` for a contiguous payload, or null (nothing
    /// claimed) when the payloads are not in `dest` or it has no room for them: unlike
    /// `claim`, never moves the payloads (reads may be writing into `dest`).
    pub fn claimDest(b: *Buffers, n: usize) ?[]u8 {
        if (!b.in_dest or b.dest.len - b.dest_used < n) return null;
        const s = b.dest[b.dest_used..][0..n];
        b.dest_used += n;
        return s;
    }

    /// A contiguous batch's sample whose payload is `space` (just taken with `claimDest`;
    /// the caller fills it, e.g. reads into it, before the batch is handed out), with its
    /// stored metadata row. Pre: `stored_metadata`, no `validate_cache`. False, with
    /// nothing appended (`space` still claimed), when the row holds a null.
    pub fn addPlaced(b: *Buffers, ds: *Dataset, loc: Loc, space: []u8) status.Error!bool {
        std.debug.assert(b.stored_metadata and !ds.options.validate_cache and b.in_dest);
        std.debug.assert(b.payload_offsets.items.len == b.count());
        const gpa = ds.gpa;
        try b.reserve(gpa, ds.fields, 1);
        if (!try b.addStored(ds, loc)) return false;
        b.payloads.appendAssumeCapacity(space.ptr);
        b.payload_lens.appendAssumeCapacity(space.len);
        b.payload_offsets.appendAssumeCapacity(@intFromPtr(space.ptr) - @intFromPtr(b.dest.ptr));
        b.cache_ids.appendAssumeCapacity(ds.caches[loc.cache].cache_id);
        b.sample_ids.appendAssumeCapacity(loc.sample_id);
        return true;
    }

    /// Keeps only the first `n` samples of a contiguous batch (the later ones' reads
    /// failed); their payload bytes are given back.
    pub fn truncate(b: *Buffers, fields: []const schema.Field, n: usize) void {
        std.debug.assert(n <= b.count() and b.payload_offsets.items.len == b.count());
        if (n == b.count()) return;
        const bytes: usize = @intCast(b.payload_offsets.items[n]);
        if (b.in_dest) b.dest_used = bytes else b.arena.items.len = bytes;
        b.payloads.items.len = n;
        b.payload_lens.items.len = n;
        b.payload_offsets.items.len = n;
        b.cache_ids.items.len = n;
        b.sample_ids.items.len = n;
        for (b.columns, fields) |*c, f| switch (f.kind) {
            .bool => c.bytes.items.len = n,
            .int => c.ints.items.len = n,
            .float => c.floats.items.len = n,
            .string => {
                c.offsets.items.len = n + 1;
                c.bytes.items.len = @intCast(c.offsets.items[n]);
            },
        };
    }

    /// Frees the arena's memory (it holds no batch: the batch is in `dest`, or none was
    /// built since `reset`) without the `undefined` fill `free` does in safety-checked
    /// builds (an arena of a large batch is many MiB).
    pub fn freeArena(b: *Buffers, gpa: std.mem.Allocator) void {
        std.debug.assert(b.arena.items.len == 0);
        mem_mod.freeUninit(gpa, b.arena.allocatedSlice());
        b.arena = .empty;
    }

    /// Gives back the last `n` bytes claimed (a sample that failed to be added).
    pub fn unclaim(b: *Buffers, n: usize) void {
        if (b.in_dest) b.dest_used -= n else b.arena.items.len -= n;
    }

    /// The batch view. For a contiguous batch (all payloads packed), payload pointers are
    /// rebased onto the arena, which no longer moves.
    pub fn view(b: *Buffers, fields: []const schema.Field, contiguous: bool) View {
        // Every array has `count` entries (string offsets `count + 1`): see //!.
        const n = b.count();
        std.debug.assert(b.payloads.items.len == n and b.payload_lens.items.len == n and b.sample_ids.items.len == n);
        for (b.columns, fields) |*c, f| {
            std.debug.assert(switch (f.kind) {
                .bool => c.bytes.items.len == n,
                .int => c.ints.items.len == n,
                .float => c.floats.items.len == n,
                .string => c.offsets.items.len == n + 1,
            });
        }
        for (b.columns, b.views, fields) |*c, *v, f| {
            v.* = .{ .kind = f.kind, .values = null, .offsets = null };
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
        const base = b.payloadBase();
        if (contiguous) {
            std.debug.assert(b.payload_offsets.items.len == b.count());
            for (b.payloads.items, b.payload_offsets.items) |*p, off| p.* = base + @as(usize, @intCast(off));
        }
        return .{
            .count = b.count(),
            .payloads = b.payloads.items.ptr,
            .payload_lens = b.payload_lens.items.ptr,
            .payload_base = if (contiguous) base else null,
            .payload_offsets = if (contiguous) b.payload_offsets.items.ptr else null,
            .cache_ids = b.cache_ids.items.ptr,
            .sample_ids = b.sample_ids.items.ptr,
            .columns = b.views,
        };
    }
};

/// Copies `payloads[k][0..lens[k]]` back to back into `dst` (exactly their total
/// length), in order: the gather of a batch's payloads (`Buffers.pack`,
/// `drt_batch_copy_payloads`). Payloads of a random-order batch lie far apart in memory,
/// so each is loaded a few payloads ahead of its copy (a hint: the same bytes without it,
/// about twice as slow for 4096 random 512-byte records).
pub fn gatherPayloads(dst: []u8, payloads: []const [*]const u8, lens: []const u64) void {
    std.debug.assert(payloads.len == lens.len);
    var at: usize = 0;
    for (payloads, lens, 0..) |p, n, k| {
        if (k + gather_payload_distance < payloads.len) {
            const ahead_len = lens[k + gather_payload_distance];
            prefetchBytes(payloads[k + gather_payload_distance], @intCast(@min(ahead_len, gather_payload_prefetch_max)));
        }
        const len: usize = @intCast(n);
        // (A payload already in its place: `dst` is the batch's own contiguous buffer.)
        if (p != dst.ptr + at) @memcpy(dst[at..][0..len], p[0..len]);
        at += len;
    }
    std.debug.assert(at == dst.len);
}

/// Bytes of one Arrow string view (the BinaryView layout of Arrow's `Utf8View` arrays,
/// `string_view` in pyarrow), and the longest string a view holds inline.
pub const string_view_bytes = 16;
pub const string_view_inline_max = 12;

/// Writes the Arrow string views of the `offsets.len - 1` strings that `offsets`
/// (non-decreasing) delimit in `values` into `views` (16 bytes each, exactly): a string
/// of up to 12 bytes as its length (i32) and its bytes inline, zero-padded; a longer one
/// as its length, its first 4 bytes, buffer index 0 and its offset (i32s) in `values`,
/// which the consumer passes as the array's one data buffer. Returns the bytes of
/// `values` that views point into (0 when every string is inline: no data buffer is
/// needed). With `views` partly written: error.Overflow when a string's length or a
/// long string's offset does not fit in an i32, error.InvalidArgument when an offset is
/// below the one before it. A consumer importing the views (Polars) skips the conversion
/// from offsets it would make otherwise.
pub fn stringViews(offsets: []const u64, values: [*]const u8, views: []u8) error{ Overflow, InvalidArgument }!u64 {
    std.debug.assert(offsets.len >= 1 and views.len == (offsets.len - 1) * string_view_bytes);
    const i32_max = std.math.maxInt(i32);
    var data_len: u64 = 0;
    for (offsets[0 .. offsets.len - 1], offsets[1..], 0..) |start, end, k| {
        const view = views[k * string_view_bytes ..][0..string_view_bytes];
        if (end < start) return error.InvalidArgument;
        const len = end - start;
        if (len > i32_max or (len > string_view_inline_max and start > i32_max)) return error.Overflow;
        std.mem.writeInt(u32, view[0..4], @intCast(len), .little);
        const bytes = values + @as(usize, @intCast(start));
        if (len <= string_view_inline_max) {
            @memset(view[4..], 0);
            @memcpy(view[4..][0..@intCast(len)], bytes[0..@intCast(len)]);
            continue;
        }
        @memcpy(view[4..8], bytes[0..4]);
        std.mem.writeInt(u32, view[8..12], 0, .little);
        std.mem.writeInt(u32, view[12..16], @intCast(start), .little);
        data_len = @max(data_len, end);
    }
    return data_len;
}

test "stringViews: short strings inline, long ones by offset into the values" {
    const values = "abcthirteen bytesZ";
    // "abc" (3, inline), "" (0, inline), "thirteen byte" (13: by offset 3), "sZ" (inline).
    const offsets = [_]u64{ 0, 3, 3, 16, 18 };
    var views: [4 * string_view_bytes]u8 = undefined;
    @memset(&views, 0xaa);
    try std.testing.expectEqual(@as(u64, 16), try stringViews(&offsets, values, &views));
    try std.testing.expectEqualSlices(u8, &.{ 3, 0, 0, 0, 'a', 'b', 'c', 0, 0, 0, 0, 0, 0, 0, 0, 0 }, views[0..16]);
    try std.testing.expectEqualSlices(u8, &([_]u8{0} ** 16), views[16..32]);
    try std.testing.expectEqualSlices(u8, &.{ 13, 0, 0, 0, 't', 'h', 'i', 'r', 0, 0, 0, 0, 3, 0, 0, 0 }, views[32..48]);
    try std.testing.expectEqualSlices(u8, &.{ 2, 0, 0, 0, 's', 'Z', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, views[48..64]);
    // Every string inline: no data buffer.
    try std.testing.expectEqual(@as(u64, 0), try stringViews(offsets[0..3], values, views[0..32]));
    // Exactly 12 bytes is still inline.
    const twelve = [_]u64{ 3, 15 };
    try std.testing.expectEqual(@as(u64, 0), try stringViews(&twelve, values, views[0..16]));
    try std.testing.expectEqualStrings("thirteen byt", views[4..16]);
    // An offset past what an i32 holds.
    const far = [_]u64{ 1 << 31, (1 << 31) + 13 };
    try std.testing.expectError(error.Overflow, stringViews(&far, values, views[0..16]));
    // Offsets that go back.
    const back = [_]u64{ 3, 2 };
    try std.testing.expectError(error.InvalidArgument, stringViews(&back, values, views[0..16]));
}

/// How many payloads ahead `gatherPayloads` starts loading one, and how many of its
/// first bytes it loads.
const gather_payload_distance = 8;
const gather_payload_prefetch_max = 4096;

/// Starts loading the `len` bytes at `bytes` into the CPU caches, a cache line at a time
/// (a hint: no effect on results). Callers bound `len` (a record's first bytes).
pub inline fn prefetchBytes(bytes: [*]const u8, len: usize) void {
    var line: usize = 0;
    while (line < len) : (line += 64) @prefetch(bytes + line, .{});
}

/// Where string row `row - 1` of `col` ends (row `row` starts): its offset `row`.
/// Pre: a utf8 or large_utf8 column, `row <= len` (the parser checked the offsets).
fn stringEnd(col: arrow.Column, row: u64) u64 {
    return switch (col.type) {
        .utf8 => @intCast(std.mem.readInt(i32, col.offsets[@intCast(row * 4)..][0..4], .little)),
        .large_utf8 => @intCast(std.mem.readInt(i64, col.offsets[@intCast(row * 8)..][0..8], .little)),
        else => unreachable,
    };
}

/// Appends to `offsets` (which has room for them) the ends of string rows
/// `row..row + n` of `col`, rebased from the column's `start` to `base`: one kind
/// dispatch for the run instead of one per row (see `stringEnd`).
fn appendStringEnds(offsets: *std.ArrayList(u64), col: arrow.Column, row: usize, n: usize, base: u64, start: u64) void {
    const out = offsets.unusedCapacitySlice()[0..n];
    switch (col.type) {
        .utf8 => for (out, row + 1..) |*o, r| {
            o.* = base + (@as(u64, @intCast(std.mem.readInt(i32, col.offsets[r * 4 ..][0..4], .little))) - start);
        },
        .large_utf8 => for (out, row + 1..) |*o, r| {
            o.* = base + (@as(u64, @intCast(std.mem.readInt(i64, col.offsets[r * 8 ..][0..8], .little))) - start);
        },
        else => unreachable,
    }
    offsets.items.len += n;
}

/// Appends the little-endian 8-byte values in `bytes` (unaligned) to `list`, which has
/// room for them.
fn appendWords(comptime T: type, list: *std.ArrayList(T), bytes: []const u8) void {
    std.debug.assert(bytes.len % 8 == 0 and list.unusedCapacitySlice().len >= bytes.len / 8);
    const n = bytes.len / 8;
    const dest = list.unusedCapacitySlice()[0..n];
    if (comptime builtin.cpu.arch.endian() == .little) {
        @memcpy(std.mem.sliceAsBytes(dest), bytes);
    } else {
        for (dest, 0..) |*v, k| v.* = @bitCast(std.mem.readInt(u64, bytes[k * 8 ..][0..8], .little));
    }
    list.items.len += n;
}

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

// ---------------------------------------------------------------- tests

const testing = std.testing;
const helpers = @import("testing.zig");
const shard = @import("../format/shard.zig");

fn boolsOf(col: ColumnView, n: usize) []const u8 {
    std.debug.assert(col.kind == .bool);
    return @as([*]const u8, @ptrCast(col.values.?))[0..n];
}

fn intsOf(col: ColumnView, n: usize) []const i64 {
    std.debug.assert(col.kind == .int);
    return @as([*]const i64, @ptrCast(@alignCast(col.values.?)))[0..n];
}

fn floatsOf(col: ColumnView, n: usize) []const f64 {
    std.debug.assert(col.kind == .float);
    return @as([*]const f64, @ptrCast(@alignCast(col.values.?)))[0..n];
}

fn stringOf(col: ColumnView, i: usize) []const u8 {
    std.debug.assert(col.kind == .string);
    const offsets = col.offsets.?;
    return @as([*]const u8, @ptrCast(col.values.?))[@intCast(offsets[i])..@intCast(offsets[i + 1])];
}

const sample_records = [_]struct { json: []const u8, payload: []const u8 }{
    .{ .json = "{\"flag\":true,\"label\":-3,\"name\":\"a\",\"score\":0.5}", .payload = "xyz" },
    .{ .json = "{\"flag\":false,\"label\":9007199254740993,\"name\":\"\",\"score\":-1e300}", .payload = "" },
    // Escaped text is decoded (into scratch) and then copied into the column.
    .{ .json = "{\"flag\":true,\"label\":0,\"name\":\"\\u00e9\\u4e2d\",\"score\":2.0}", .payload = "payload" },
};

test "batch: one typed column per field, string offsets, payloads left in place" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{"plain_one_shard"}, .{});
    defer env.close();
    const ds = env.ds;
    var b = try Buffers.init(gpa, ds.fields.len);
    defer b.deinit(gpa);
    // flag, label, name, score: one field of each kind.
    try helpers.expectFields(&helpers.fixture_fields, ds.fields);

    // Twice: the second round checks that reset leaves nothing behind.
    for (0..2) |_| {
        try b.reset(gpa, ds.fields);
        const empty = b.view(ds.fields, false);
        try testing.expectEqual(@as(u64, 0), empty.count);
        try testing.expectEqual(@as(u64, 0), empty.columns[2].offsets.?[0]);
        for (sample_records, 0..) |r, i| try b.add(ds, .{ .cache = 0, .sample_id = 10 + i }, r.json, r.payload);
        try testing.expectEqual(@as(u64, 3), b.count());
        const v = b.view(ds.fields, false);
        try testing.expectEqual(@as(u64, 3), v.count);
        try testing.expectEqualSlices(u64, &.{ env.cache_ids[0], env.cache_ids[0], env.cache_ids[0] }, v.cache_ids.?[0..3]);
        try testing.expectEqualSlices(u64, &.{ 10, 11, 12 }, v.sample_ids.?[0..3]);
        // Payloads are not copied: the view points at the caller's bytes.
        try testing.expect(v.payload_base == null and v.payload_offsets == null);
        try testing.expectEqual(sample_records[0].payload.ptr, v.payloads.?[0]);
        try testing.expectEqual(sample_records[2].payload.ptr, v.payloads.?[2]);
        try testing.expectEqualSlices(u64, &.{ 3, 0, 7 }, v.payload_lens.?[0..3]);
        // An empty payload still has a real address.
        try testing.expectEqual(sample_records[1].json.ptr, v.payloads.?[1]);

        try testing.expectEqual(@as(usize, 4), v.columns.len);
        try testing.expectEqualSlices(u8, &.{ 1, 0, 1 }, boolsOf(v.columns[0], 3));
        try testing.expectEqualSlices(i64, &.{ -3, 9007199254740993, 0 }, intsOf(v.columns[1], 3));
        try testing.expectEqualSlices(f64, &.{ 0.5, -1e300, 2.0 }, floatsOf(v.columns[3], 3));
        try testing.expectEqualSlices(u64, &.{ 0, 1, 1, 6 }, v.columns[2].offsets.?[0..4]);
        try testing.expectEqualStrings("a", stringOf(v.columns[2], 0));
        try testing.expectEqualStrings("", stringOf(v.columns[2], 1));
        try testing.expectEqualStrings("é中", stringOf(v.columns[2], 2));
        for (v.columns[0..2]) |c| try testing.expect(c.offsets == null);
    }
}

test "batch: pack copies payloads into one arena in order and the view is rebased onto it" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{"plain_one_shard"}, .{});
    defer env.close();
    const ds = env.ds;
    var b = try Buffers.init(gpa, ds.fields.len);
    defer b.deinit(gpa);
    try b.reset(gpa, ds.fields);
    // Payload sources that are overwritten after packing (as slot buffers are reused).
    var sources: [3][8]u8 = undefined;
    for (sample_records, &sources, 0..) |r, *src, i| {
        @memcpy(src[0..r.payload.len], r.payload);
        try b.add(ds, .{ .cache = 0, .sample_id = i }, r.json, src[0..r.payload.len]);
        // Packed round by round, like an iterator's contiguous batch: 2 then 1.
        if (i == 1) try b.pack(gpa, 0);
    }
    try b.pack(gpa, 2);
    for (&sources) |*src| @memset(src, '!');
    const v = b.view(ds.fields, true);
    try testing.expectEqual(@as(u64, 3), v.count);
    const base = v.payload_base.?;
    try testing.expectEqualSlices(u64, &.{ 0, 3, 3 }, v.payload_offsets.?[0..3]);
    try testing.expectEqualStrings("xyzpayload", base[0..10]);
    for (sample_records, 0..) |r, i| {
        try testing.expectEqual(base + @as(usize, @intCast(v.payload_offsets.?[i])), v.payloads.?[i]);
        try testing.expectEqualStrings(r.payload, v.payloads.?[i][0..@intCast(v.payload_lens.?[i])]);
    }
    // Only empty payloads: the arena still has an address.
    try b.reset(gpa, ds.fields);
    try b.add(ds, .{ .cache = 0, .sample_id = 1 }, sample_records[1].json, "");
    try b.pack(gpa, 0);
    const e = b.view(ds.fields, true);
    try testing.expect(e.payload_base != null);
    try testing.expectEqual(@as(u64, 0), e.payload_offsets.?[0]);
    try testing.expectEqual(e.payload_base.?, e.payloads.?[0]);
}

test "batch: JSON null floats come from metadata.arrow; malformed JSON is a JSON error" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{"plain_one_shard"}, .{});
    defer env.close();
    const ds = env.ds;
    var b = try Buffers.init(gpa, ds.fields.len);
    defer b.deinit(gpa);
    try b.reset(gpa, ds.fields);
    // The reference writes NaN and infinities as null; the value is sample 100's row.
    try b.add(ds, .{ .cache = 0, .sample_id = 100 }, "{\"flag\":true,\"label\":1,\"name\":\"n\",\"score\":null}", "p");
    const want = env.expected[0].samples()[100].metadata.object.get("score").?.float;
    const v = b.view(ds.fields, false);
    try testing.expectEqual(@as(u64, @bitCast(want)), @as(u64, @bitCast(floatsOf(v.columns[3], 1)[0])));

    try b.reset(gpa, ds.fields);
    try testing.expectError(error.Json, b.add(ds, .{ .cache = 0, .sample_id = 0 }, "{\"flag\":true", "p"));
    try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "JSON error: "));
    try testing.expectEqual(@as(u64, 0), b.count());
}

test "batch: with validate_cache every sample is compared with its metadata.arrow row" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{"plain_one_shard"}, .{ .validate_cache = true });
    defer env.close();
    const ds = env.ds;
    var b = try Buffers.init(gpa, ds.fields.len);
    defer b.deinit(gpa);
    try b.reset(gpa, ds.fields);
    const image = try helpers.readRecord(gpa, ds, .{ .cache = 0, .sample_id = 3 });
    defer gpa.free(image);
    const rec = try shard.split(image);
    // Sample 3's own record matches its row...
    try b.add(ds, .{ .cache = 0, .sample_id = 3 }, rec.json, rec.stored_payload);
    try helpers.expectColumns(ds.fields, b.view(ds.fields, false), 0, env.expected[0].samples()[3].metadata);
    // ...and is rejected as sample 4's.
    try testing.expectError(error.InvalidCache, b.add(ds, .{ .cache = 0, .sample_id = 4 }, rec.json, rec.stored_payload));
    try testing.expectEqualStrings("embedded metadata does not match metadata.arrow for sample 4", status.lastMessage());
}

test "batch: stored metadata comes from metadata.arrow without parsing the JSON, across caches" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const ds = env.ds;
    var b = try Buffers.init(gpa, ds.fields.len);
    defer b.deinit(gpa);
    b.stored_metadata = true;
    try b.reset(gpa, ds.fields);
    // Caches and rows interleaved (so the record-batch cache is refilled); the JSON is
    // not even looked at.
    var locs: std.ArrayList(Loc) = .empty;
    defer locs.deinit(gpa);
    for (0..40) |k| {
        const cache: u32 = @intCast(k % ds.caches.len);
        const n = ds.caches[cache].sampleCount();
        try locs.append(gpa, .{ .cache = cache, .sample_id = (k * 7919) % n });
    }
    for (locs.items) |loc| try b.add(ds, loc, "not json", "p");
    const v = b.view(ds.fields, false);
    try testing.expectEqual(@as(u64, locs.items.len), v.count);
    for (locs.items, 0..) |loc, i| {
        try testing.expectEqual(loc.sample_id, v.sample_ids.?[i]);
        try helpers.expectColumns(ds.fields, v, i, env.expected[loc.cache].samples()[@intCast(loc.sample_id)].metadata);
    }
}

test "batch: stored metadata with validate_cache still parses and compares the JSON" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{"plain_one_shard"}, .{ .validate_cache = true });
    defer env.close();
    const ds = env.ds;
    var b = try Buffers.init(gpa, ds.fields.len);
    defer b.deinit(gpa);
    b.stored_metadata = true;
    try b.reset(gpa, ds.fields);
    try testing.expectError(error.Json, b.add(ds, .{ .cache = 0, .sample_id = 0 }, "{\"flag\":true", "p"));
    try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "JSON error: "));
    const image = try helpers.readRecord(gpa, ds, .{ .cache = 0, .sample_id = 3 });
    defer gpa.free(image);
    const rec = try shard.split(image);
    try testing.expectError(error.InvalidCache, b.add(ds, .{ .cache = 0, .sample_id = 4 }, rec.json, rec.stored_payload));
    try testing.expectEqualStrings("embedded metadata does not match metadata.arrow for sample 4", status.lastMessage());
}

test "batch: addRun gives what addCopy gives, in runs cut at record batches" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const ds = env.ds;
    var one = try Buffers.init(gpa, ds.fields.len);
    defer one.deinit(gpa);
    var run = try Buffers.init(gpa, ds.fields.len);
    defer run.deinit(gpa);
    one.stored_metadata = true;
    run.stored_metadata = true;
    const payloads = [_][]const u8{ "a", "", "bcd", "efgh", "", "ijklmnop", "q" } ** 40;
    var dest: [4096]u8 = undefined;
    for (ds.caches, 0..) |*c, ci| {
        const cache: u32 = @intCast(ci);
        const n = @min(payloads.len, c.sampleCount());
        try one.reset(gpa, ds.fields);
        try run.reset(gpa, ds.fields);
        run.into(&dest); // payloads in the caller's memory, as iter_batches asks for
        for (payloads[0..n], 0..) |p, i| try one.addCopy(ds, .{ .cache = cache, .sample_id = i }, "not json", p);
        var added: usize = 0;
        while (added < n) {
            const k = try run.addRun(ds, cache, added, payloads[added..n], false);
            try testing.expect(k > 0); // writer-made caches hold no nulls
            added += k;
        }
        const a = one.view(ds.fields, true);
        const b = run.view(ds.fields, true);
        try testing.expectEqual(a.count, b.count);
        try testing.expectEqual(@as(?[*]const u8, &dest), b.payload_base);
        for (0..@intCast(a.count)) |i| {
            try testing.expectEqualStrings(a.payloads.?[i][0..@intCast(a.payload_lens.?[i])], b.payloads.?[i][0..@intCast(b.payload_lens.?[i])]);
            try testing.expectEqual(a.payload_offsets.?[i], b.payload_offsets.?[i]);
            try testing.expectEqual(a.cache_ids.?[i], b.cache_ids.?[i]);
            try testing.expectEqual(a.sample_ids.?[i], b.sample_ids.?[i]);
            try helpers.expectColumns(ds.fields, b, i, env.expected[ci].samples()[i].metadata);
        }
        for (a.columns, b.columns, ds.fields) |x, y, f| switch (f.kind) {
            .bool => try testing.expectEqualSlices(u8, boolsOf(x, @intCast(a.count)), boolsOf(y, @intCast(b.count))),
            .int => try testing.expectEqualSlices(i64, intsOf(x, @intCast(a.count)), intsOf(y, @intCast(b.count))),
            .float => try testing.expectEqualSlices(u64, @ptrCast(floatsOf(x, @intCast(a.count))), @ptrCast(floatsOf(y, @intCast(b.count)))),
            .string => try testing.expectEqualSlices(u64, x.offsets.?[0..@intCast(a.count + 1)], y.offsets.?[0..@intCast(b.count + 1)]),
        };
    }
    // Parsed metadata (validate_cache, or not stored): nothing in bulk.
    run.stored_metadata = false;
    try run.reset(gpa, ds.fields);
    try testing.expectEqual(@as(usize, 0), try run.addRun(ds, 0, 0, payloads[0..3], false));
}

test "batch: addStoredRows gives the rows addRun gives, with empty payloads, across record batches" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const ds = env.ds;
    var b = try Buffers.init(gpa, ds.fields.len);
    defer b.deinit(gpa);
    b.stored_metadata = true;
    for (ds.caches, 0..) |*c, ci| {
        const cache: u32 = @intCast(ci);
        const n = c.sampleCount();
        // Every row, then a range from the middle to the end, then none.
        for ([_][2]u64{ .{ 0, n }, .{ n / 3, n - n / 3 }, .{ n, 0 } }) |range| {
            const first, const count = range;
            try b.reset(gpa, ds.fields);
            try testing.expectEqual(count, try b.addStoredRows(ds, cache, first, count));
            const v = b.view(ds.fields, false);
            try testing.expectEqual(count, v.count);
            for (0..@intCast(count)) |i| {
                const sample_id = first + i;
                try testing.expectEqual(@as(u64, 0), v.payload_lens.?[i]);
                try testing.expectEqual(c.cache_id, v.cache_ids.?[i]);
                try testing.expectEqual(sample_id, v.sample_ids.?[i]);
                try helpers.expectColumns(ds.fields, v, i, env.expected[ci].samples()[@intCast(sample_id)].metadata);
            }
        }
    }
}

test "batch: addStoredRun gives what add gives, for samples in any order across caches" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const ds = env.ds;
    var one = try Buffers.init(gpa, ds.fields.len);
    defer one.deinit(gpa);
    var run = try Buffers.init(gpa, ds.fields.len);
    defer run.deinit(gpa);
    one.stored_metadata = true;
    run.stored_metadata = true;
    try one.reset(gpa, ds.fields);
    try run.reset(gpa, ds.fields);
    // Random rows, a cache change every few samples, repeats, empty payloads.
    var locs: std.ArrayList(Loc) = .empty;
    defer locs.deinit(gpa);
    var payloads: std.ArrayList([]const u8) = .empty;
    defer payloads.deinit(gpa);
    const texts = [_][]const u8{ "a", "bcd", "efgh", "ijklmnop" };
    const json: []const u8 = "not json";
    for (0..300) |k| {
        const cache: u32 = @intCast((k / 5) % ds.caches.len);
        const n = ds.caches[cache].sampleCount();
        try locs.append(gpa, .{ .cache = cache, .sample_id = (k * 7919 + k / 3) % n });
        // An empty payload's address is its JSON's, as `add` gives it.
        try payloads.append(gpa, if (k % 7 == 0) json[0..0] else texts[k % texts.len]);
    }
    for (locs.items, payloads.items) |loc, p| try one.add(ds, loc, json, p);
    var added: usize = 0;
    var calls: usize = 0;
    while (added < locs.items.len) : (calls += 1) {
        const k = try run.addStoredRun(ds, locs.items[added..], payloads.items[added..]);
        try testing.expect(k > 0); // writer-made caches hold no nulls
        added += k;
    }
    try testing.expect(calls > 1 and calls < locs.items.len); // runs, cut at caches
    const a = one.view(ds.fields, false);
    const b = run.view(ds.fields, false);
    try testing.expectEqual(a.count, b.count);
    const count: usize = @intCast(a.count);
    try testing.expectEqualSlices([*]const u8, a.payloads.?[0..count], b.payloads.?[0..count]);
    try testing.expectEqualSlices(u64, a.payload_lens.?[0..count], b.payload_lens.?[0..count]);
    try testing.expectEqualSlices(u64, a.cache_ids.?[0..count], b.cache_ids.?[0..count]);
    try testing.expectEqualSlices(u64, a.sample_ids.?[0..count], b.sample_ids.?[0..count]);
    for (a.columns, b.columns, ds.fields) |x, y, f| switch (f.kind) {
        .bool => try testing.expectEqualSlices(u8, boolsOf(x, count), boolsOf(y, count)),
        .int => try testing.expectEqualSlices(i64, intsOf(x, count), intsOf(y, count)),
        .float => try testing.expectEqualSlices(u64, @ptrCast(floatsOf(x, count)), @ptrCast(floatsOf(y, count))),
        .string => {
            try testing.expectEqualSlices(u64, x.offsets.?[0 .. count + 1], y.offsets.?[0 .. count + 1]);
            for (0..count) |i| try testing.expectEqualStrings(stringOf(x, i), stringOf(y, i));
        },
    };
    for (locs.items, 0..) |loc, i| try helpers.expectColumns(ds.fields, b, i, env.expected[loc.cache].samples()[@intCast(loc.sample_id)].metadata);
    // Parsed metadata (validate_cache, or not stored): nothing in bulk.
    run.stored_metadata = false;
    try run.reset(gpa, ds.fields);
    try testing.expectEqual(@as(usize, 0), try run.addStoredRun(ds, locs.items[0..3], payloads.items[0..3]));
    try testing.expectEqual(@as(u64, 0), run.count());
}

test "batch: gatherPayloads copies many payloads of any length back to back, in order" {
    // More payloads than the prefetch distance, lengths from 0 to past the prefetched
    // bytes, sources scattered over one buffer in no particular order.
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(11);
    const random = prng.random();
    const source = try gpa.alloc(u8, 1 << 16);
    defer gpa.free(source);
    random.bytes(source);
    var ptrs: [100][*]const u8 = undefined;
    var lens: [100]u64 = undefined;
    var total: usize = 0;
    for (&ptrs, &lens, 0..) |*p, *len, k| {
        const n: usize = switch (k % 4) {
            0 => 0,
            1 => random.uintAtMost(usize, 64),
            2 => random.uintAtMost(usize, 600),
            else => gather_payload_prefetch_max + random.uintAtMost(usize, 3000),
        };
        p.* = source[random.uintAtMost(usize, source.len - n)..].ptr;
        len.* = n;
        total += n;
    }
    const dst = try gpa.alloc(u8, total);
    defer gpa.free(dst);
    gatherPayloads(dst, &ptrs, &lens);
    var at: usize = 0;
    for (ptrs, lens) |p, n| {
        const len: usize = @intCast(n);
        try testing.expectEqualSlices(u8, p[0..len], dst[at..][0..len]);
        at += len;
    }
    try testing.expectEqual(total, at);
}

test "batch: truncate keeps the first samples of a contiguous batch" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{"plain_one_shard"}, .{});
    defer env.close();
    const ds = env.ds;
    var b = try Buffers.init(gpa, ds.fields.len);
    defer b.deinit(gpa);
    b.stored_metadata = true;
    try b.reset(gpa, ds.fields);
    var dest: [64]u8 = undefined;
    b.into(&dest);
    for (0..5) |i| {
        const space = b.claimDest(3).?;
        @memset(space, @intCast('a' + i));
        try testing.expect(try b.addPlaced(ds, .{ .cache = 0, .sample_id = i }, space));
    }
    try testing.expectEqual(@as(?[]u8, null), b.claimDest(64 - 15 + 1)); // never spills
    b.truncate(ds.fields, 2);
    const v = b.view(ds.fields, true);
    try testing.expectEqual(@as(u64, 2), v.count);
    try testing.expectEqualStrings("aaabbb", v.payload_base.?[0..6]);
    for (0..2) |i| try helpers.expectColumns(ds.fields, v, i, env.expected[0].samples()[i].metadata);
    try testing.expectEqual(@as(u64, 1), v.sample_ids.?[1]);
    // The space of the samples dropped is free again.
    try testing.expectEqual(@as(usize, 6), b.dest_used);
}
