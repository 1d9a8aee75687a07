//! Validating a new active table (update_metadata) over Arrow-layout columns handed
//! across the ABI by pointer, and building the immutable `Table` it becomes.
//!
//! The checks and their order are dataset-rt 0.4.8's, so a table with several faults
//! reports the same one: one pass over the rows (for each row: cache_id null / integer
//! type / non-negative, sample_id likewise, weight null / numeric type, identity known;
//! the first failing row wins), then a second pass requiring positive finite weights.
//! A column without a validity bitmap (Arrow's null type among them) has no null cells.
//! Nothing is allocated for the caller's data beyond the new table itself.

const std = @import("std");
const status = @import("../base/status.zig");
const sampler = @import("sampler.zig");
const dataset_mod = @import("dataset.zig");
const Dataset = dataset_mod.Dataset;
const Table = dataset_mod.Table;

/// The type of a column's values, as the caller laid them out.
pub const ValueType = enum { other, u64, u32, i64, i32, f64, f32 };

/// One Arrow-layout column handed over by pointer: `values` (null for `other`), an
/// optional validity bitmap, and the row offset into both.
pub const Column = struct {
    type: ValueType,
    values: ?*const anyopaque,
    validity: ?[*]const u8,
    offset: u64,

    fn isNull(col: Column, row: usize) bool {
        const bits = col.validity orelse return false;
        const bit = col.offset + row;
        return (bits[@intCast(bit / 8)] >> @intCast(bit % 8)) & 1 == 0;
    }

    fn isInteger(col: Column) bool {
        return switch (col.type) {
            .u64, .u32, .i64, .i32 => true,
            else => false,
        };
    }

    fn isNumeric(col: Column) bool {
        return col.isInteger() or col.type == .f64 or col.type == .f32;
    }

    /// The value as i128 (integers only), so negative and u64 values compare exactly.
    fn int(col: Column, row: usize) i128 {
        const v = col.values.?;
        return switch (col.type) {
            .u64 => @as([*]const u64, @ptrCast(@alignCast(v)))[row],
            .u32 => @as([*]const u32, @ptrCast(@alignCast(v)))[row],
            .i64 => @as([*]const i64, @ptrCast(@alignCast(v)))[row],
            .i32 => @as([*]const i32, @ptrCast(@alignCast(v)))[row],
            else => unreachable,
        };
    }

    fn float(col: Column, row: usize) f64 {
        const v = col.values.?;
        return switch (col.type) {
            .f64 => @as([*]const f64, @ptrCast(@alignCast(v)))[row],
            .f32 => @as([*]const f32, @ptrCast(@alignCast(v)))[row],
            else => @floatFromInt(col.int(row)),
        };
    }
};

fn checkId(col: Column, comptime name: []const u8, row: usize) status.Error!u64 {
    // The cell's null before the column's type, as 0.4.8: a null in row 0 of a float
    // column is "contains null", the float in row 0 "must be an integer". A column of
    // nulls only (Polars' Null dtype) has no validity bitmap, so no null cell: its type.
    if (col.isNull(row)) return status.fail(error.InvalidArgument, "samples metadata column '" ++ name ++ "' contains null", .{});
    if (!col.isInteger()) return status.fail(error.InvalidArgument, "samples metadata column '" ++ name ++ "' must be an integer", .{});
    const v = col.int(row);
    if (v < 0) return status.fail(error.InvalidArgument, "samples metadata column '" ++ name ++ "' must be non-negative", .{});
    return @intCast(v);
}

/// Validates the columns and builds the table (weighted mode). Caller owns the result.
pub fn build(ds: *const Dataset, row_count: u64, cid_col: Column, sid_col: Column, w_col: Column) status.Error!*Table {
    const gpa = ds.gpa;
    if (row_count == 0) return status.fail(error.InvalidArgument, "metadata table must include at least one sample", .{});
    const n: usize = std.math.cast(usize, row_count) orelse return status.fail(error.Overflow, "metadata table is too large", .{});
    for ([_]Column{ cid_col, sid_col, w_col }) |col| {
        if (col.isNumeric() and col.values == null) return status.fail(error.InvalidArgument, "a numeric table column has no values", .{});
    }

    const table = try gpa.create(Table);
    errdefer gpa.destroy(table);
    const cache_index = try gpa.alloc(u32, n);
    errdefer gpa.free(cache_index);
    const sample_id = try gpa.alloc(u64, n);
    errdefer gpa.free(sample_id);
    const weight = try gpa.alloc(f64, n);
    defer gpa.free(weight);

    // Pass 1: identities and weight cells, row by row.
    var last_cache_id: ?u64 = null;
    var last_index: u32 = 0;
    for (0..n) |row| {
        const cid = try checkId(cid_col, "cache_id", row);
        const sid = try checkId(sid_col, "sample_id", row);
        // The row's weight cell before its identity, as 0.4.8.
        if (w_col.isNull(row)) return status.fail(error.InvalidArgument, "samples metadata column 'weight' contains null", .{});
        if (!w_col.isNumeric()) return status.fail(error.InvalidArgument, "samples metadata column 'weight' must be numeric", .{});
        if (last_cache_id == null or last_cache_id.? != cid) {
            last_index = ds.ids.get(cid) orelse
                return status.fail(error.InvalidArgument, "unknown samples metadata row identity cache_id={d} sample_id={d}", .{ cid, sid });
            last_cache_id = cid;
        }
        if (sid >= ds.caches[last_index].sampleCount()) {
            return status.fail(error.InvalidArgument, "unknown samples metadata row identity cache_id={d} sample_id={d}", .{ cid, sid });
        }
        cache_index[row] = last_index;
        sample_id[row] = sid;
        weight[row] = w_col.float(row);
    }
    // Pass 2: weight values.
    for (weight, 0..) |w, row| {
        if (!(std.math.isFinite(w) and w > 0)) return status.fail(error.InvalidArgument, "weight {d} must be positive and finite", .{row});
    }
    const weighted = sampler.WeightedTable.init(gpa, weight) catch |err| switch (err) {
        error.OutOfMemory => return error.OutOfMemory,
        error.InvalidWeights => return status.fail(error.InvalidArgument, "the weights' sum must be finite", .{}),
    };
    table.* = .{ .gpa = gpa, .len = row_count, .cache = cache_index, .sample_id = sample_id, .weights = weighted };
    return table;
}

// ---------------------------------------------------------------- tests

const testing = std.testing;
const helpers = @import("testing.zig");

/// A column over `values` with an optional validity bitmap.
fn testColumn(comptime T: type, values: []const T, validity: ?[]const u8, offset: u64) Column {
    const value_type: ValueType = switch (T) {
        u64 => .u64,
        u32 => .u32,
        i64 => .i64,
        i32 => .i32,
        f64 => .f64,
        f32 => .f32,
        else => @compileError("not a table column type"),
    };
    return .{ .type = value_type, .values = values.ptr, .validity = if (validity) |v| v.ptr else null, .offset = offset };
}

const other_column: Column = .{ .type = .other, .values = null, .validity = null, .offset = 0 };

test "table: build checks rows in order, each row's cells in order, then weights, with the reference's messages" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{ "plain_one_shard", "unicode_é_name" }, .{});
    defer env.close();
    const ds = env.ds;
    const a = env.cache_ids[0];
    const b = env.cache_ids[1];
    // Six valid rows; each case below breaks some of them.
    const cids = [_]u64{ a, a, b, b, a, b };
    const sids = [_]u64{ 0, 1, 2, 3, 4, 5 };
    const ones = [_]f64{ 1, 1, 1, 1, 1, 1 };
    const row3_null = [_]u8{0b1111_0111};
    const row0_null = [_]u8{0b1111_1110};
    const row4_null = [_]u8{0b1110_1111};
    const negative_row2 = [_]i64{ 0, 1, -2, 3, 4, 5 };
    const signed_cids = [_]i64{ @intCast(a), @intCast(a), @intCast(b), @intCast(b), @intCast(a), @intCast(b) };
    const negative_cid_row0 = [_]i64{ -1, @intCast(a), @intCast(b), @intCast(b), @intCast(a), @intCast(b) };
    const unknown_cid_row5 = [_]u64{ a, a, b, b, a, 123 };
    const unknown_sid_row2 = [_]u64{ 0, 1, 99, 3, 4, 5 };
    const zero_row1 = [_]f64{ 1, 0, 1, 1, 1, 1 };
    const nan_row4 = [_]f64{ 1, 1, 1, 1, std.math.nan(f64), 1 };
    const negative_row0 = [_]f64{ -1, 1, 1, 1, 1, 1 };
    const inf_row5 = [_]f32{ 1, 1, 1, 1, 1, std.math.inf(f32) };
    const huge = [_]f64{ 1e308, 1e308, 1e308, 1, 1, 1 };
    const float_ids = [_]f64{ 0, 1, 2, 3, 4, 5 };
    const small_sids = [_]i32{ 0, 1, 2, -1, 4, 5 };

    var unknown_sid_message: [128]u8 = undefined;
    const Case = struct { rows: u64 = 6, cid: Column, sid: Column, w: Column, message: []const u8 };
    const cases = [_]Case{
        .{ .rows = 0, .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "metadata table must include at least one sample" },
        .{ .cid = testColumn(u64, &cids, &row3_null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'cache_id' contains null" },
        .{ .cid = testColumn(f64, &float_ids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'cache_id' must be an integer" },
        .{ .cid = testColumn(i64, &negative_cid_row0, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'cache_id' must be non-negative" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, &row0_null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'sample_id' contains null" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(f64, &float_ids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'sample_id' must be an integer" },
        .{ .cid = testColumn(i64, &signed_cids, null, 0), .sid = testColumn(i32, &small_sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'sample_id' must be non-negative" },
        .{ .cid = testColumn(u64, &unknown_cid_row5, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "unknown samples metadata row identity cache_id=123 sample_id=5" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &unknown_sid_row2, null, 0), .w = testColumn(f64, &ones, null, 0), .message = try std.fmt.bufPrint(&unknown_sid_message, "unknown samples metadata row identity cache_id={d} sample_id=99", .{b}) },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, &row0_null, 0), .message = "samples metadata column 'weight' contains null" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = other_column, .message = "samples metadata column 'weight' must be numeric" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &zero_row1, null, 0), .message = "weight 1 must be positive and finite" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &nan_row4, null, 0), .message = "weight 4 must be positive and finite" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &negative_row0, null, 0), .message = "weight 0 must be positive and finite" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f32, &inf_row5, null, 0), .message = "weight 5 must be positive and finite" },
        // Each weight is fine, their sum is not (this project's message).
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &huge, null, 0), .message = "the weights' sum must be finite" },
        .{ .cid = .{ .type = .u64, .values = null, .validity = null, .offset = 0 }, .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "a numeric table column has no values" },
        // Order: a null weight in row 0 before a null sample_id in row 4 (rows first).
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, &row4_null, 0), .w = testColumn(f64, &ones, &row0_null, 0), .message = "samples metadata column 'weight' contains null" },
        // In one row, the weight cell before the identity (0.4.8).
        .{ .cid = testColumn(u64, &unknown_cid_row5, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = .{ .type = .other, .values = null, .validity = null, .offset = 0 }, .message = "samples metadata column 'weight' must be numeric" },
        // An unknown identity in row 5 before a negative weight in row 0 (weights last).
        .{ .cid = testColumn(u64, &unknown_cid_row5, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &negative_row0, null, 0), .message = "unknown samples metadata row identity cache_id=123 sample_id=5" },
        // The cell before the type (0.4.8): a null in row 0 of a float or a string column...
        .{ .cid = testColumn(f64, &float_ids, &row0_null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'cache_id' contains null" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = .{ .type = .other, .values = null, .validity = &row0_null, .offset = 0 }, .message = "samples metadata column 'weight' contains null" },
        // ...its type when row 0 holds a value, and for a typeless column (no validity).
        .{ .cid = testColumn(f64, &float_ids, &row3_null, 0), .sid = testColumn(u64, &sids, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'cache_id' must be an integer" },
        .{ .cid = testColumn(u64, &cids, null, 0), .sid = testColumn(u64, &sids, null, 0), .w = .{ .type = .other, .values = null, .validity = null, .offset = 0 }, .message = "samples metadata column 'weight' must be numeric" },
        // In one row, cache_id before sample_id.
        .{ .cid = testColumn(i64, &negative_cid_row0, null, 0), .sid = testColumn(u64, &sids, &row0_null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'cache_id' must be non-negative" },
        // The validity offset: bit 3 is row 3 at offset 0 (sample_id row 2 fails first)...
        .{ .cid = testColumn(i64, &signed_cids, &row3_null, 0), .sid = testColumn(i64, &negative_row2, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'sample_id' must be non-negative" },
        // ...and row 2 at offset 1 (its cache_id is null, checked before its sample_id).
        .{ .cid = testColumn(i64, &signed_cids, &row3_null, 1), .sid = testColumn(i64, &negative_row2, null, 0), .w = testColumn(f64, &ones, null, 0), .message = "samples metadata column 'cache_id' contains null" },
    };
    for (cases, 0..) |case, i| {
        errdefer std.debug.print("case {d}: {s}\n", .{ i, case.message });
        try testing.expectError(error.InvalidArgument, build(ds, case.rows, case.cid, case.sid, case.w));
        try testing.expectEqualStrings(case.message, status.lastMessage());
    }
}

test "table: a valid weighted table of any integer and float widths" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{ "plain_one_shard", "unicode_é_name" }, .{ .shuffle = true });
    defer env.close();
    const ds = env.ds;
    const cids = [_]i64{ @intCast(env.cache_ids[1]), @intCast(env.cache_ids[0]), @intCast(env.cache_ids[1]) };
    const sids = [_]u32{ 3, 0, 9 };
    // A null bit on a row past the table is ignored.
    const validity = [_]u8{0b0000_0111};
    const weights = [_]f32{ 2.0, 1.0, 0.5 };
    const t = try build(ds, 3, testColumn(i64, &cids, &validity, 0), testColumn(u32, &sids, null, 0), testColumn(f32, &weights, &validity, 0));
    try testing.expectEqual(@as(u64, 3), t.len);
    try testing.expectEqualSlices(u32, &.{ 1, 0, 1 }, t.cache);
    try testing.expectEqualSlices(u64, &.{ 3, 0, 9 }, t.sample_id);
    try testing.expectEqual(@as(f64, 3.5), t.weights.?.total);
    try testing.expectEqualSlices(f64, &.{ 2.0, 3.0 }, t.weights.?.cumulative);
    // Integer weights are numeric too.
    const int_weights = [_]u64{ 1, 2, 3 };
    const t2 = try build(ds, 3, testColumn(i64, &cids, null, 0), testColumn(u32, &sids, null, 0), testColumn(u64, &int_weights, null, 0));
    try testing.expectEqual(@as(f64, 6), t2.weights.?.total);
    t2.release();

    // Once active, weighted draws pick only the table's rows, the heavier more often.
    ds.replaceTable(t);
    try testing.expectEqual(@as(u64, 3), ds.epochLen());
    var hits = [_]u32{ 0, 0, 0 };
    for (0..4000) |p| {
        const loc = ds.locate(ds.table, p);
        const row: usize = if (loc.cache == 0) 1 else if (loc.sample_id == 3) 0 else 2;
        try testing.expectEqual(@as(u64, sids[row]), loc.sample_id);
        hits[row] += 1;
    }
    try testing.expect(hits[0] > hits[1] and hits[1] > hits[2] and hits[2] > 0);
}
