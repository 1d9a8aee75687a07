//! Writer of the Arrow IPC *file* format for a cache's `metadata.arrow`: one record batch
//! of non-null bool, int64, float64 and utf8 columns, as the reference release and our
//! Python writer (pyarrow) store them. `arrow.zig` reads what this writes; pyarrow, Polars
//! and arrow-rs read it too (tests/test_writer_metadata.py checks them).
//!
//! Layout (Arrow columnar format, "IPC File Format"), every part 8-byte aligned:
//!
//!   "ARROW1\0\0" | Schema message | RecordBatch message + body | end-of-stream marker |
//!   Footer flatbuffer | i32 footer length | "ARROW1"
//!
//! An encapsulated message is the continuation marker 0xFFFFFFFF, an i32 length, the
//! `Message` flatbuffer padded to 8 bytes; a record batch's body follows it. Buffers are
//! listed per column (validity, then values; for utf8 validity, offsets, data), each
//! padded to 8 bytes in the body; validity buffers are empty (no nulls).
//!
//! Flatbuffers are built front to back (`Builder`): a table is written after its vtable
//! and before everything it references, so every reference (an unsigned offset) points
//! forward and is patched once its target is placed. Every scalar sits at a position
//! aligned to its size within the flatbuffer, and strings end in a NUL byte, as the
//! flatbuffers verifiers of arrow-rs and Arrow C++ require.

const std = @import("std");
const schema = @import("schema.zig");
const status = @import("../base/status.zig");

/// One column to write. `values`: for bool a bitmap of `rows` bits (bit i of byte i / 8
/// is row i), for int and float `8 * rows` little-endian bytes, for string the UTF-8
/// data; `offsets` (string only): `rows + 1` little-endian i32 offsets into `values`,
/// starting at 0, never decreasing, ending at `values.len`.
pub const Column = struct {
    name: []const u8,
    kind: schema.Kind,
    values: []const u8,
    offsets: []const u8 = &.{},
};

const magic = "ARROW1";
const continuation = 0xFFFF_FFFF;
/// MetadataVersion V5.
const version_v5: i16 = 4;
/// MessageHeader union members.
const header_schema: u8 = 1;
const header_record_batch: u8 = 3;
/// Type union members (Schema.fbs).
const type_int: u8 = 2;
const type_floating_point: u8 = 3;
const type_utf8: u8 = 5;
const type_bool: u8 = 6;
/// FloatingPoint.precision DOUBLE.
const precision_double: i16 = 2;

/// Writes `metadata.arrow` for `rows` rows of `columns`, in order, through
/// `sinkWrite(context, bytes)` (which keeps no reference to `bytes`).
/// Pre: every column is well formed as `Column` says for `rows` rows (the writer checked
/// the values when they were appended). Errors: `error.OutOfMemory`, or the sink's.
pub fn write(gpa: std.mem.Allocator, rows: u64, columns: []const Column, context: anytype, comptime sinkWrite: anytype) !void {
    var b: Builder = .{ .gpa = gpa };
    defer b.buf.deinit(gpa);
    var offset: u64 = 0;

    try sinkWrite(context, magic ++ "\x00\x00");
    offset += 8;

    // The schema message (the stream's first message; readers of the file use the copy
    // in the footer, but the stream part must be a valid stream on its own).
    try b.message(header_schema, 0, columns, rows);
    try sinkWrite(context, b.buf.items);
    offset += b.buf.items.len;

    // The record batch: its message, then the body.
    const batch_offset = offset;
    var body_len: u64 = 0;
    for (columns) |c| {
        for (bufferLengths(c)) |len| body_len += padded(len);
    }
    try b.message(header_record_batch, body_len, columns, rows);
    const meta_len = b.buf.items.len;
    try sinkWrite(context, b.buf.items);
    offset += meta_len;
    const zeros = [_]u8{0} ** 8;
    for (columns) |c| {
        const parts = [_][]const u8{ &.{}, c.values, c.offsets };
        const count: usize = if (c.kind == .string) 3 else 2;
        // utf8 buffers are validity, offsets, data.
        const order = if (c.kind == .string) [_]usize{ 0, 2, 1 } else [_]usize{ 0, 1, 2 };
        for (order[0..count]) |p| {
            const bytes = parts[p];
            try sinkWrite(context, bytes);
            try sinkWrite(context, zeros[0..@intCast(padded(bytes.len) - bytes.len)]);
        }
    }
    offset += body_len;

    // End of stream, then the footer.
    var eos: [8]u8 = undefined;
    std.mem.writeInt(u32, eos[0..4], continuation, .little);
    std.mem.writeInt(u32, eos[4..8], 0, .little);
    try sinkWrite(context, &eos);

    try b.footer(columns, .{ .offset = batch_offset, .meta_len = meta_len, .body_len = body_len });
    try sinkWrite(context, b.buf.items);
    var tail: [4 + magic.len]u8 = undefined;
    std.mem.writeInt(i32, tail[0..4], @intCast(b.buf.items.len), .little);
    tail[4..].* = magic.*;
    try sinkWrite(context, &tail);
}

/// Byte lengths of a column's buffers in its buffer order (validity first, always empty).
fn bufferLengths(c: Column) [3]u64 {
    return if (c.kind == .string) .{ 0, c.offsets.len, c.values.len } else .{ 0, c.values.len, 0 };
}

fn padded(len: u64) u64 {
    return std.mem.alignForward(u64, len, 8);
}

const Block = struct { offset: u64, meta_len: u64, body_len: u64 };

// ------------------------------------------------------------------------- flatbuffers

/// One field of a table: a scalar of `size` bytes, or a reference (4 bytes, left 0 and
/// patched once its target is placed: `Builder.patch`).
const Slot = struct {
    id: u16,
    size: u8,
    value: u64 = 0,
};

const Builder = struct {
    gpa: std.mem.Allocator,
    buf: std.ArrayList(u8) = .empty,

    fn pos(b: *const Builder) u32 {
        return @intCast(b.buf.items.len);
    }

    fn pad(b: *Builder, alignment: u32) !void {
        const to = std.mem.alignForward(usize, b.buf.items.len, alignment);
        try b.buf.appendNTimes(b.gpa, 0, to - b.buf.items.len);
    }

    fn int(b: *Builder, comptime T: type, value: T) !void {
        var bytes: [@sizeOf(T)]u8 = undefined;
        std.mem.writeInt(T, &bytes, value, .little);
        try b.buf.appendSlice(b.gpa, &bytes);
    }

    /// Makes the reference at `at` point to `target` (a later position).
    fn patch(b: *Builder, at: u32, target: u32) void {
        std.debug.assert(target > at);
        std.mem.writeInt(u32, b.buf.items[at..][0..4], target - at, .little);
    }

    /// Writes a vtable and its table of `slots` (ids ascending; each placed at a position
    /// aligned to its size, the table itself 8-aligned); returns the table's position and
    /// each slot's.
    fn table(b: *Builder, comptime n: usize, slots: [n]Slot) !struct { start: u32, at: [n]u32 } {
        var at: [n]u32 = undefined;
        var size: u32 = 4; // the soffset to the vtable
        for (slots, 0..) |s, i| {
            size = std.mem.alignForward(u32, size, @as(u32, s.size));
            at[i] = size;
            size += s.size;
        }
        const fields: u32 = if (n == 0) 0 else slots[n - 1].id + 1;
        const vtable_len = 4 + 2 * fields;
        // The table starts 8-aligned right after the vtable (which is 2-aligned).
        try b.pad(2);
        const table_start = std.mem.alignForward(u32, b.pos() + vtable_len, 8);
        try b.buf.appendNTimes(b.gpa, 0, table_start - vtable_len - b.pos());
        const vtable = b.pos();
        try b.int(u16, @intCast(vtable_len));
        try b.int(u16, @intCast(size));
        for (0..fields) |id| {
            var off: u16 = 0;
            for (slots, 0..) |s, i| {
                if (s.id == id) off = @intCast(at[i]);
            }
            try b.int(u16, off);
        }
        std.debug.assert(b.pos() == table_start);
        try b.int(i32, @intCast(table_start - vtable));
        try b.buf.appendNTimes(b.gpa, 0, size - 4);
        for (slots, &at) |s, *p| {
            p.* += table_start;
            const dest = b.buf.items[p.*..][0..s.size];
            switch (s.size) {
                1 => dest[0] = @intCast(s.value),
                2 => std.mem.writeInt(u16, dest[0..2], @intCast(s.value), .little),
                4 => std.mem.writeInt(u32, dest[0..4], @intCast(s.value), .little),
                8 => std.mem.writeInt(u64, dest[0..8], s.value, .little),
                else => unreachable,
            }
        }
        return .{ .start = table_start, .at = at };
    }

    /// Starts a vector of `count` elements of `elem_align`-aligned elements: writes its
    /// length and returns the position of its first element.
    fn vector(b: *Builder, count: usize, elem_align: u32) !u32 {
        try b.pad(4);
        while ((b.pos() + 4) % elem_align != 0) try b.int(u32, 0);
        const start = b.pos();
        try b.int(u32, @intCast(count));
        return start;
    }

    fn string(b: *Builder, s: []const u8) !u32 {
        const start = try b.vector(s.len, 1);
        try b.buf.appendSlice(b.gpa, s);
        try b.buf.append(b.gpa, 0);
        return start;
    }

    /// A `Schema` table at the current position: little-endian, non-null `columns`.
    fn schemaTable(b: *Builder, columns: []const Column) !u32 {
        // Schema: 0 endianness (Little, the default), 1 fields.
        const s = try b.table(1, .{.{ .id = 1, .size = 4 }});
        const vec = try b.vector(columns.len, 4);
        b.patch(s.at[0], vec);
        try b.buf.appendNTimes(b.gpa, 0, 4 * columns.len);
        for (columns, 0..) |c, i| {
            const elem: u32 = @intCast(vec + 4 + 4 * i);
            const type_id: u8 = switch (c.kind) {
                .bool => type_bool,
                .int => type_int,
                .float => type_floating_point,
                .string => type_utf8,
            };
            // Field: 0 name, 1 nullable (false, the default), 2 type_type, 3 type,
            // 5 children (empty, but present: Arrow C++ requires the vector).
            const f = try b.table(4, .{
                .{ .id = 0, .size = 4 },
                .{ .id = 2, .size = 1, .value = type_id },
                .{ .id = 3, .size = 4 },
                .{ .id = 5, .size = 4 },
            });
            b.patch(elem, f.start);
            b.patch(f.at[0], try b.string(c.name));
            const t = switch (c.kind) {
                // Int: 0 bitWidth, 1 is_signed.
                .int => (try b.table(2, .{ .{ .id = 0, .size = 4, .value = 64 }, .{ .id = 1, .size = 1, .value = 1 } })).start,
                // FloatingPoint: 0 precision.
                .float => (try b.table(1, .{.{ .id = 0, .size = 2, .value = @intCast(precision_double) }})).start,
                // Bool, Utf8: no fields.
                .bool, .string => (try b.table(0, .{})).start,
            };
            b.patch(f.at[2], t);
            b.patch(f.at[3], try b.vector(0, 4));
        }
        return s.start;
    }

    /// Replaces the buffer with an encapsulated `Message` (marker, length, flatbuffer,
    /// padding to 8) holding a schema or a one-batch record batch of `rows` rows.
    fn message(b: *Builder, header: u8, body_len: u64, columns: []const Column, rows: u64) !void {
        b.buf.clearRetainingCapacity();
        try b.int(u32, continuation);
        try b.int(u32, 0); // the length, set below
        // The flatbuffer starts at byte 8: positions within it are `pos() - 8`, and both
        // are aligned alike.
        const root = b.pos();
        try b.int(u32, 0);
        // Message: 0 version, 1 header_type, 2 header, 3 bodyLength.
        const m = try b.table(4, .{
            .{ .id = 0, .size = 2, .value = @intCast(version_v5) },
            .{ .id = 1, .size = 1, .value = header },
            .{ .id = 2, .size = 4 },
            .{ .id = 3, .size = 8, .value = body_len },
        });
        b.patch(root, m.start);
        if (header == header_schema) {
            b.patch(m.at[2], try b.schemaTable(columns));
        } else {
            // RecordBatch: 0 length, 1 nodes, 2 buffers.
            const r = try b.table(3, .{
                .{ .id = 0, .size = 8, .value = rows },
                .{ .id = 1, .size = 4 },
                .{ .id = 2, .size = 4 },
            });
            b.patch(m.at[2], r.start);
            b.patch(r.at[1], try b.vector(columns.len, 8));
            for (columns) |_| {
                try b.int(u64, rows);
                try b.int(u64, 0); // null_count
            }
            const buffer_count: usize = blk: {
                var n: usize = 0;
                for (columns) |c| n += if (c.kind == .string) 3 else 2;
                break :blk n;
            };
            b.patch(r.at[2], try b.vector(buffer_count, 8));
            var at: u64 = 0;
            for (columns) |c| {
                const lens = bufferLengths(c);
                for (lens[0..if (c.kind == .string) 3 else 2]) |len| {
                    try b.int(u64, at);
                    try b.int(u64, len);
                    at += padded(len);
                }
            }
        }
        try b.pad(8);
        std.mem.writeInt(u32, b.buf.items[4..8], @intCast(b.buf.items.len - 8), .little);
    }

    /// Replaces the buffer with the `Footer` flatbuffer (8-byte multiple) for one batch.
    fn footer(b: *Builder, columns: []const Column, block: Block) !void {
        b.buf.clearRetainingCapacity();
        const root = b.pos();
        try b.int(u32, 0);
        // Footer: 0 version, 1 schema, 2 dictionaries, 3 recordBatches.
        const f = try b.table(4, .{
            .{ .id = 0, .size = 2, .value = @intCast(version_v5) },
            .{ .id = 1, .size = 4 },
            .{ .id = 2, .size = 4 },
            .{ .id = 3, .size = 4 },
        });
        b.patch(root, f.start);
        b.patch(f.at[1], try b.schemaTable(columns));
        b.patch(f.at[2], try b.vector(0, 8));
        b.patch(f.at[3], try b.vector(1, 8));
        // Block: offset i64, metaDataLength i32 (+4 padding), bodyLength i64.
        try b.int(u64, block.offset);
        try b.int(u32, @intCast(block.meta_len));
        try b.int(u32, 0);
        try b.int(u64, block.body_len);
        try b.pad(8);
    }
};

// ------------------------------------------------------------------------------- tests

const testing = std.testing;
const arrow = @import("arrow.zig");

fn appendTo(list: *std.ArrayList(u8), bytes: []const u8) !void {
    try list.appendSlice(testing.allocator, bytes);
}

fn writeToList(rows: u64, columns: []const Column) !std.ArrayList(u8) {
    var out: std.ArrayList(u8) = .empty;
    errdefer out.deinit(testing.allocator);
    try write(testing.allocator, rows, columns, &out, appendTo);
    return out;
}

test "arrow_write: what it writes, arrow.zig reads back value for value" {
    const gpa = testing.allocator;
    var ints: [3 * 8]u8 = undefined;
    var floats: [3 * 8]u8 = undefined;
    for ([_]i64{ -1, 0, std.math.maxInt(i64) }, 0..) |x, i| std.mem.writeInt(i64, ints[i * 8 ..][0..8], x, .little);
    for ([_]f64{ 0.5, -2.25, 1e300 }, 0..) |x, i| std.mem.writeInt(u64, floats[i * 8 ..][0..8], @bitCast(x), .little);
    var offsets: [4 * 4]u8 = undefined;
    for ([_]i32{ 0, 3, 3, 6 }, 0..) |x, i| std.mem.writeInt(i32, offsets[i * 4 ..][0..4], x, .little);
    const columns = [_]Column{
        .{ .name = "flag", .kind = .bool, .values = &.{0b101} },
        .{ .name = "n", .kind = .int, .values = &ints },
        .{ .name = "score", .kind = .float, .values = &floats },
        .{ .name = "text", .kind = .string, .values = "héllo", .offsets = &offsets },
    };
    var out = try writeToList(3, &columns);
    defer out.deinit(gpa);

    var file = arrow.File.parse(gpa, out.items) catch |err| {
        std.debug.print("{s}\n", .{status.lastMessage()});
        return err;
    };
    defer file.deinit(gpa);
    try testing.expectEqual(@as(u64, 3), file.row_count);
    try testing.expectEqual(@as(usize, 4), file.fields.len);
    for (columns, file.fields) |c, f| {
        try testing.expectEqualStrings(c.name, f.name);
        try testing.expectEqual(c.kind, f.type.kind().?);
        try testing.expect(!f.nullable);
    }
    const cols = file.batches[0].columns;
    try testing.expect(cols[0].getBool(0) and !cols[0].getBool(1) and cols[0].getBool(2));
    try testing.expectEqual(std.math.maxInt(i64), cols[1].getInt(2));
    try testing.expectEqual(@as(f64, -2.25), cols[2].getFloat(1));
    try testing.expectEqualStrings("hé", cols[3].getString(0));
    try testing.expectEqualStrings("", cols[3].getString(1));
    try testing.expectEqualStrings("llo", cols[3].getString(2));
}

test "arrow_write: no columns is one batch of `rows` rows" {
    const gpa = testing.allocator;
    var out = try writeToList(5, &.{});
    defer out.deinit(gpa);
    var file = try arrow.File.parse(gpa, out.items);
    defer file.deinit(gpa);
    try testing.expectEqual(@as(u64, 5), file.row_count);
    try testing.expectEqual(@as(usize, 0), file.fields.len);
    try testing.expectEqual(@as(usize, 1), file.batches.len);
}

test "arrow_write: the same bytes for the same input, every part 8-aligned" {
    const gpa = testing.allocator;
    var offsets: [2 * 4]u8 = undefined;
    std.mem.writeInt(i32, offsets[0..4], 0, .little);
    std.mem.writeInt(i32, offsets[4..8], 1, .little);
    const columns = [_]Column{.{ .name = "a", .kind = .string, .values = "x", .offsets = &offsets }};
    var a = try writeToList(1, &columns);
    defer a.deinit(gpa);
    var b = try writeToList(1, &columns);
    defer b.deinit(gpa);
    try testing.expectEqualSlices(u8, a.items, b.items);
    // Everything before the footer length and trailing magic is a multiple of 8.
    try testing.expectEqual(@as(usize, 0), (a.items.len - 10) % 8);
}
