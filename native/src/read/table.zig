//! Validating a new active table (update_metadata) over Arrow-layout columns handed
//! across the ABI by pointer, and building the immutable `Table` it becomes.
//!
//! The checks and their order are dataset-rt 0.4.8's, so a table with several faults
//! reports the same one: one pass over the rows (for each row: cache_id null / integer
//! type / non-negative, sample_id likewise, identity known, weight null / numeric type;
//! the first failing row wins), then a second pass requiring positive finite weights.
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
        if (last_cache_id == null or last_cache_id.? != cid) {
            last_index = ds.ids.get(cid) orelse
                return status.fail(error.InvalidArgument, "unknown samples metadata row identity cache_id={d} sample_id={d}", .{ cid, sid });
            last_cache_id = cid;
        }
        if (sid >= ds.caches[last_index].sampleCount()) {
            return status.fail(error.InvalidArgument, "unknown samples metadata row identity cache_id={d} sample_id={d}", .{ cid, sid });
        }
        if (w_col.isNull(row)) return status.fail(error.InvalidArgument, "samples metadata column 'weight' contains null", .{});
        if (!w_col.isNumeric()) return status.fail(error.InvalidArgument, "samples metadata column 'weight' must be numeric", .{});
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
