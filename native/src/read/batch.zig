//! Building one batch of samples for the caller: identities, payload pointers (or one
//! contiguous arena), and the embedded JSON parsed against the schema into one typed
//! column per field. Iterators and lookups both hand out batches built here.
//!
//! Invariants:
//! - Every array of a batch has `count` entries (string columns `count + 1` offsets).
//! - A view's pointers stay valid until the next `reset` (the next call on the handle).
//! - With `validate_cache`, every sample's parsed values equal its `metadata.arrow` row.

const std = @import("std");
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
        for (b.columns, fields) |*c, f| {
            c.bytes.clearRetainingCapacity();
            c.ints.clearRetainingCapacity();
            c.floats.clearRetainingCapacity();
            c.offsets.clearRetainingCapacity();
            if (f.kind == .string) try c.offsets.append(gpa, 0);
        }
    }

    /// Appends one sample: parses its embedded JSON into the columns (resolving JSON
    /// nulls and, with validate_cache, comparing with metadata.arrow) and records its
    /// payload. `payload` must stay where it is until the batch is handed out or packed.
    pub fn add(b: *Buffers, ds: *Dataset, loc: Loc, json: []const u8, payload: []const u8) status.Error!void {
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

    pub fn count(b: *const Buffers) u64 {
        return b.cache_ids.items.len;
    }

    /// Copies the payloads of samples `first..` into the arena (their source buffers can
    /// then be reused) and records their offsets.
    pub fn pack(b: *Buffers, gpa: std.mem.Allocator, first: u64) status.Error!void {
        const start: usize = @intCast(first);
        std.debug.assert(b.payload_offsets.items.len == start);
        var total: usize = 0;
        for (b.payload_lens.items[start..]) |n| total += @intCast(n);
        try b.arena.ensureUnusedCapacity(gpa, @max(total, 1)); // a real address even when all payloads are empty
        for (b.payloads.items[start..], b.payload_lens.items[start..]) |p, n| {
            try b.payload_offsets.append(gpa, b.arena.items.len);
            b.arena.appendSliceAssumeCapacity(p[0..@intCast(n)]);
        }
    }

    /// The batch view. For a contiguous batch (all payloads packed), payload pointers are
    /// rebased onto the arena, which no longer moves.
    pub fn view(b: *Buffers, fields: []const schema.Field, contiguous: bool) View {
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
        if (contiguous) {
            std.debug.assert(b.payload_offsets.items.len == b.count());
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
            .columns = b.views,
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
