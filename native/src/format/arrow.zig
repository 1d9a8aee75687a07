//! Minimal, bounds-checked reader of the Arrow IPC *file* format, enough to read a cache's
//! `metadata.arrow` (written by arrow-rs in the reference release, or by pyarrow / polars)
//! straight out of caller-owned bytes (typically an mmap), without copying column data.
//!
//! Layout of an IPC file (Arrow columnar format, "IPC File Format"):
//!
//!   "ARROW1\0\0" | stream messages ... | Footer flatbuffer | i32 footer length | "ARROW1"
//!
//! The footer (flatbuffer `Footer`) holds the schema and one `Block{offset, metaDataLength,
//! bodyLength}` per record batch. Each block points at an encapsulated message: an optional
//! 0xFFFFFFFF continuation marker, an i32 metadata size, the `Message` flatbuffer (padded;
//! `metaDataLength` covers prefix + flatbuffer + padding), then `bodyLength` bytes of body.
//! A `RecordBatch` message lists one `FieldNode{length, null_count}` per array node (depth
//! first over the schema) and one `Buffer{offset, length}` (relative to the body) per
//! buffer, in the same order. We only read the footer: the schema message and any
//! dictionary batches at the start of the stream part are skipped.
//!
//! Supported column types are bool (bitmap), Int(64, signed), FloatingPoint(DOUBLE), Utf8
//! and LargeUtf8 (i32 / i64 offsets). Every other type is reported as `.other`: its nodes
//! and buffers are counted (so later columns are located correctly) but never interpreted.
//! Compressed bodies, dictionary-encoded fields, unions, big-endian files and metadata
//! versions other than V4/V5 are rejected with an `error.Arrow`.
//!
//! Invariants (the parser is meant to be fuzzed with corrupted files):
//! - Every offset, length and count read from the file is checked before use, in u64
//!   arithmetic that cannot overflow (all positions are bounded by the input length, which
//!   is far below 2^63). A bad input yields `error.InvalidCache` / `error.Arrow` (with a
//!   message in the thread-local status buffer) or `error.OutOfMemory`, never a panic or
//!   an out-of-bounds read.
//! - When `parse` succeeds, every `Column` of a supported type has buffers long enough for
//!   `Column.len` rows, utf8 offsets that start at >= 0, never decrease and end within the
//!   data buffer, valid UTF-8 in every non-null string, and a validity bitmap whose zero
//!   bits match `null_count`. The accessors therefore stay in bounds for `row < len`.
//! - Work and memory are linear in the input size. Flatbuffer offsets may alias (several
//!   references to one table), so we additionally require what every writer produces:
//!   record-batch blocks are disjoint and ascending, and the non-empty buffers of a body
//!   are disjoint and ascending. Without this, a small crafted file could make thousands
//!   of batches or columns share one large body and cost quadratic validation time.
//!   Nested schemas are walked with a depth limit and a visit budget for the same reason.
//! - No global state: the only side effect is `status.fail` on the error path.

const std = @import("std");
const schema = @import("schema.zig");
const status = @import("../base/status.zig");

const Error = status.Error;

/// Magic at both ends of an IPC file. The leading copy is padded to 8 bytes.
const magic = "ARROW1";

/// `MetadataVersion` values we read: V4 (3) and V5 (4). V5 only changed union layout,
/// which we reject anyway, so both share one reading path.
const version_v4: i16 = 3;
const version_v5: i16 = 4;

/// Union member numbers of `MessageHeader` (Message.fbs).
const header_record_batch: u8 = 3;

/// Union member numbers of `Type` (Schema.fbs).
const TypeId = struct {
    const none = 0;
    const null_ = 1;
    const int = 2;
    const floating_point = 3;
    const binary = 4;
    const utf8 = 5;
    const bool_ = 6;
    const decimal = 7;
    const date = 8;
    const time = 9;
    const timestamp = 10;
    const interval = 11;
    const list = 12;
    const struct_ = 13;
    const union_ = 14;
    const fixed_size_binary = 15;
    const fixed_size_list = 16;
    const map = 17;
    const duration = 18;
    const large_binary = 19;
    const large_utf8 = 20;
    const large_list = 21;
    const run_end_encoded = 22;
    const binary_view = 23;
    const utf8_view = 24;
    const list_view = 25;
    const large_list_view = 26;
};

/// `FloatingPoint.precision` value for 64-bit floats.
const precision_double: i16 = 2;

/// Deepest field nesting we follow when counting the nodes of `.other` columns. Real
/// metadata is flat; the limit only keeps recursion bounded on hostile input.
const max_depth = 64;

/// Physical type of one column, as far as this reader distinguishes them.
pub const ColumnType = enum {
    bool,
    int64,
    float64,
    utf8,
    large_utf8,
    /// Any other Arrow type (int32, float32, string_view, list, struct, null, ...).
    /// Counted for layout purposes only; its `Column` carries no buffers.
    other,

    /// The cache kind stored with this Arrow type, or null when a cache never stores it
    /// (`metadata.arrow` strings are always utf8, never large_utf8).
    pub fn kind(t: ColumnType) ?schema.Kind {
        return switch (t) {
            .bool => .bool,
            .int64 => .int,
            .float64 => .float,
            .utf8 => .string,
            .large_utf8, .other => null,
        };
    }
};

/// One top-level schema field. `name` points into the file bytes (not validated as UTF-8).
pub const Field = struct {
    name: []const u8,
    type: ColumnType,
    nullable: bool,
};

/// One column of one record batch. All slices point into the file bytes given to
/// `File.parse`. Buffers are not necessarily aligned, so values are decoded with
/// `std.mem.readInt`, never by casting pointers.
pub const Column = struct {
    type: ColumnType,
    /// Rows in this column (equal to its batch's length).
    len: u64,
    /// Validity bitmap (bit i set = row i is valid), or null when `null_count == 0` (some
    /// writers still store an all-ones bitmap then; it is ignored). Always null for
    /// `.other`.
    validity: ?[]const u8,
    null_count: u64,
    /// bool: value bitmap; int64/float64: at least 8 * len little-endian bytes;
    /// utf8/large_utf8: the string data. Empty for `.other`.
    values: []const u8,
    /// utf8: at least 4 * (len + 1) bytes of little-endian i32 offsets into `values`;
    /// large_utf8: the same with 8-byte i64 offsets. Empty otherwise, and possibly empty
    /// when `len == 0`.
    offsets: []const u8,

    /// Pre: `type == .bool`, `row < len`.
    pub fn getBool(c: Column, row: u64) bool {
        std.debug.assert(c.type == .bool and row < c.len);
        return bitAt(c.values, row);
    }

    /// Pre: `type == .int64`, `row < len`.
    pub fn getInt(c: Column, row: u64) i64 {
        std.debug.assert(c.type == .int64 and row < c.len);
        const at: usize = @intCast(row * 8);
        return std.mem.readInt(i64, c.values[at..][0..8], .little);
    }

    /// Pre: `type == .float64`, `row < len`. NaN payloads are kept bit for bit.
    pub fn getFloat(c: Column, row: u64) f64 {
        std.debug.assert(c.type == .float64 and row < c.len);
        const at: usize = @intCast(row * 8);
        return @bitCast(std.mem.readInt(u64, c.values[at..][0..8], .little));
    }

    /// Pre: `type` is `.utf8` or `.large_utf8`, `row < len`. Post: valid UTF-8 unless the
    /// row is null (a null row's bytes are whatever the writer left, usually empty).
    pub fn getString(c: Column, row: u64) []const u8 {
        std.debug.assert(row < c.len);
        const start, const end = switch (c.type) {
            .utf8 => .{ offsetAt(i32, c.offsets, row), offsetAt(i32, c.offsets, row + 1) },
            .large_utf8 => .{ offsetAt(i64, c.offsets, row), offsetAt(i64, c.offsets, row + 1) },
            else => unreachable,
        };
        return c.values[@intCast(start)..@intCast(end)];
    }

    /// Pre: `row < len`. Always false for columns without nulls.
    pub fn isNull(c: Column, row: u64) bool {
        std.debug.assert(row < c.len);
        const bits = c.validity orelse return false;
        return !bitAt(bits, row);
    }
};

/// One record batch: `length` rows starting at global row `first_row`.
pub const Batch = struct {
    first_row: u64,
    length: u64,
    /// One column per `File.fields` entry, in the same order.
    columns: []Column,
};

/// A parsed IPC file. Borrows the bytes given to `parse`; owns only its slices.
pub const File = struct {
    fields: []Field,
    batches: []Batch,
    /// Sum of the batch lengths.
    row_count: u64,

    /// Parses and fully validates `bytes` as an Arrow IPC file.
    /// Pre: `bytes` stays valid and unchanged until `deinit` (names and columns point
    /// into it). Post on success: the invariants of the module header hold, batches are
    /// in file order and `batches[i].first_row` is the sum of the earlier lengths.
    /// Errors: `error.InvalidCache` ("invalid metadata Arrow footer") when `bytes` does
    /// not start with the Arrow magic (garbage, or an IPC *stream*); `error.Arrow` ("Arrow
    /// error: ...") for anything else wrong or unsupported, including a missing trailing
    /// magic (a truncated file), a footer length outside the file and a footer failing
    /// verification ("Parser error: Unable to get root as footer: ..."), as the reference
    /// release's reader (arrow-rs, its validated open) reports them; `error.OutOfMemory`.
    pub fn parse(gpa: std.mem.Allocator, bytes: []const u8) Error!File {
        if (bytes.len < magic.len or !std.mem.eql(u8, bytes[0..magic.len], magic)) {
            return status.fail(error.InvalidCache, "invalid metadata Arrow footer", .{});
        }
        // Leading magic + padding (8), footer length (4), trailing magic (6).
        const lead = 8;
        const tail = 4 + magic.len;
        if (bytes.len < lead + tail or !std.mem.eql(u8, bytes[bytes.len - magic.len ..], magic)) {
            return arrowFail("Parser error: Arrow file does not contain correct footer", .{});
        }
        // In the words of the reference release's reader (arrow-rs).
        const footer_len = std.mem.readInt(i32, bytes[bytes.len - tail ..][0..4], .little);
        if (footer_len < 0) return arrowFail("Parser error: Invalid footer length: {d}", .{footer_len});
        if (footer_len == 0 or footer_len > bytes.len - lead - tail) {
            return arrowFail("Parser error: Unable to get root as footer: a footer length of {d} bytes does not fit the file", .{footer_len});
        }
        const footer_end = bytes.len - tail;
        const footer_start = footer_end - @as(usize, @intCast(footer_len));
        const flat: Flat = .{ .buf = bytes[footer_start..footer_end], .what = "footer" };
        const footer = try flat.root();
        try checkVersion(try footer.scalar(i16, 0, 0), "footer");

        const schema_table = try footer.table(1) orelse return arrowFail("footer has no schema", .{});
        if (try schema_table.scalar(i16, 0, 0) != 0) return arrowFail("big-endian Arrow files are not supported", .{});
        const field_vec = try schema_table.vector(1, 4);

        var file: File = .{ .fields = &.{}, .batches = &.{}, .row_count = 0 };
        errdefer file.deinit(gpa);
        file.fields = try gpa.alloc(Field, field_vec.len);
        const layouts = try gpa.alloc(Layout, field_vec.len);
        defer gpa.free(layouts);

        // Each real field table costs well over 4 footer bytes, so this budget never binds
        // on honest files but caps the walk when children vectors alias one another.
        var budget: u64 = flat.buf.len / 4 + 1;
        var total: Layout = .{ .nodes = 0 };
        for (file.fields, layouts, 0..) |*f, *layout, i| {
            const t = try field_vec.tableAt(i);
            layout.* = try layoutOf(t, 0, &budget);
            f.* = .{
                .name = try t.string(0) orelse "",
                .type = try columnType(t),
                .nullable = try t.scalar(bool, 1, false),
            };
            total.nodes += layout.nodes;
            total.buffers += layout.buffers;
            total.views += layout.views;
        }

        const blocks = try footer.vector(3, block_size);
        file.batches = try gpa.alloc(Batch, blocks.len);
        var built: usize = 0;
        errdefer {
            for (file.batches[0..built]) |b| gpa.free(b.columns);
            gpa.free(file.batches);
            file.batches = &.{};
        }
        var ctx: BatchContext = .{
            .gpa = gpa,
            .bytes = bytes,
            .limit = footer_start,
            .fields = file.fields,
            .layouts = layouts,
            .total = total,
            .next_free = lead,
        };
        for (file.batches, 0..) |*b, i| {
            b.* = try ctx.read(blocks, i, file.row_count);
            built += 1;
            file.row_count = std.math.add(u64, file.row_count, b.length) catch
                return arrowFail("total row count overflows", .{});
        }
        return file;
    }

    /// Frees what `parse` allocated. The file bytes are untouched.
    pub fn deinit(self: *File, gpa: std.mem.Allocator) void {
        for (self.batches) |b| gpa.free(b.columns);
        gpa.free(self.batches);
        gpa.free(self.fields);
        self.* = undefined;
    }

    /// Row `row` (across batches): which batch and index within it — O(log batches).
    /// Pre: `row < row_count`. Post: `batches[batch].length > index`, so empty batches
    /// are never returned.
    pub fn locate(self: File, row: u64) struct { batch: usize, index: u64 } {
        std.debug.assert(row < self.row_count);
        // First batch whose end lies beyond `row`; ends are non-decreasing, and an empty
        // batch's end equals its start, so it is skipped.
        var lo: usize = 0;
        var hi: usize = self.batches.len;
        while (lo < hi) {
            const mid = lo + (hi - lo) / 2;
            const b = self.batches[mid];
            if (b.first_row + b.length <= row) lo = mid + 1 else hi = mid;
        }
        return .{ .batch = lo, .index = row - self.batches[lo].first_row };
    }
};

// ------------------------------------------------------------------------------ errors

fn arrowFail(comptime fmt: []const u8, args: anytype) Error {
    return status.fail(error.Arrow, "Arrow error: " ++ fmt, args);
}

fn checkVersion(v: i16, what: []const u8) Error!void {
    if (v != version_v4 and v != version_v5) {
        return arrowFail("unsupported metadata version {d} in {s} (only V4 and V5 are supported)", .{ @as(i32, v) + 1, what });
    }
}

// ------------------------------------------------------------------------- flatbuffers
//
// Flatbuffer binary layout, as far as we need it: all integers little-endian; a buffer
// starts with a u32 offset to the root table. A table starts with an i32 `soffset`; its
// vtable is at `table - soffset` and holds u16 vtable size, u16 table size, then one u16
// per field id giving the field's offset from the table start (0 or beyond the vtable =
// absent, use the default). Reference fields (tables, vectors, strings) hold a u32 offset
// relative to the field's own position. Vectors and strings start with a u32 element
// count. Structs are stored inline. Unions are two fields: a u8 type then the value table.

const Flat = struct {
    buf: []const u8,
    /// Names the structure in error messages.
    what: []const u8,

    /// A footer that fails verification is an Arrow parser error in the reference's
    /// words ("Unable to get root as footer"); any other structure's is an Arrow error.
    fn bad(f: Flat, comptime detail: []const u8) Error {
        if (std.mem.eql(u8, f.what, "footer")) {
            return arrowFail("Parser error: Unable to get root as footer: malformed flatbuffer: " ++ detail, .{});
        }
        return arrowFail("malformed {s} flatbuffer: " ++ detail, .{f.what});
    }

    /// Reads a little-endian integer at `pos`, or fails when it does not fit.
    fn read(f: Flat, comptime T: type, pos: u64) Error!T {
        const size = @sizeOf(T);
        if (pos > f.buf.len or f.buf.len - pos < size) return f.bad("offset out of bounds");
        const p: usize = @intCast(pos);
        return std.mem.readInt(T, f.buf[p..][0..size], .little);
    }

    fn root(f: Flat) Error!Table {
        return f.tableAt(try f.read(u32, 0));
    }

    fn tableAt(f: Flat, pos: u64) Error!Table {
        const soffset = try f.read(i32, pos);
        // pos <= buf.len < 2^63, so the subtraction cannot overflow i64.
        const vtable_signed = @as(i64, @intCast(pos)) - soffset;
        if (vtable_signed < 0) return f.bad("vtable offset out of bounds");
        const vtable: u64 = @intCast(vtable_signed);
        const vtable_len = try f.read(u16, vtable);
        const table_len = try f.read(u16, vtable + 2);
        if (vtable_len < 4 or vtable_len % 2 != 0 or vtable + vtable_len > f.buf.len) return f.bad("invalid vtable");
        if (pos + table_len > f.buf.len) return f.bad("table out of bounds");
        return .{ .flat = f, .pos = pos, .vtable = vtable, .vtable_len = vtable_len };
    }
};

const Table = struct {
    flat: Flat,
    pos: u64,
    vtable: u64,
    vtable_len: u16,

    /// Absolute position of field `id`, or null when absent. Not yet range-checked for
    /// the field's size: every read goes through `Flat.read`, which is.
    fn fieldPos(t: Table, id: u16) Error!?u64 {
        const slot = 4 + 2 * @as(u64, id);
        if (slot + 2 > t.vtable_len) return null;
        const off = try t.flat.read(u16, t.vtable + slot);
        if (off == 0) return null;
        return t.pos + off;
    }

    fn scalar(t: Table, comptime T: type, id: u16, default: T) Error!T {
        const p = try t.fieldPos(id) orelse return default;
        if (T == bool) return try t.flat.read(u8, p) != 0;
        return t.flat.read(T, p);
    }

    /// Target of reference field `id`, or null when absent.
    fn target(t: Table, id: u16) Error!?u64 {
        const p = try t.fieldPos(id) orelse return null;
        return try deref(t.flat, p);
    }

    fn table(t: Table, id: u16) Error!?Table {
        const at = try t.target(id) orelse return null;
        return try t.flat.tableAt(at);
    }

    /// Vector field `id` of `elem_size`-byte elements; empty when absent.
    fn vector(t: Table, id: u16, elem_size: u64) Error!Vector {
        const at = try t.target(id) orelse return .{ .flat = t.flat, .start = 0, .len = 0, .elem_size = elem_size };
        return vectorAt(t.flat, at, elem_size);
    }

    fn string(t: Table, id: u16) Error!?[]const u8 {
        const at = try t.target(id) orelse return null;
        const v = try vectorAt(t.flat, at, 1);
        return t.flat.buf[@intCast(v.start)..@intCast(v.start + v.len)];
    }
};

/// Follows the u32 offset stored at `pos`.
fn deref(f: Flat, pos: u64) Error!u64 {
    const at = pos + try f.read(u32, pos);
    if (at >= f.buf.len) return f.bad("offset out of bounds");
    return at;
}

fn vectorAt(f: Flat, at: u64, elem_size: u64) Error!Vector {
    const len = try f.read(u32, at);
    const start = at + 4;
    // len < 2^32 and elem_size <= 24, so the product cannot overflow.
    if (start > f.buf.len or len * elem_size > f.buf.len - start) return f.bad("vector out of bounds");
    return .{ .flat = f, .start = start, .len = len, .elem_size = elem_size };
}

const Vector = struct {
    flat: Flat,
    start: u64,
    len: u64,
    elem_size: u64,

    /// Pre: `i < len`. Reads a `T` at byte `field` of inline element `i`.
    fn get(v: Vector, comptime T: type, i: u64, field: u64) Error!T {
        std.debug.assert(i < v.len and field + @sizeOf(T) <= v.elem_size);
        return v.flat.read(T, v.start + i * v.elem_size + field);
    }

    /// Pre: `i < len`, elements are table offsets.
    fn tableAt(v: Vector, i: u64) Error!Table {
        std.debug.assert(i < v.len and v.elem_size == 4);
        return v.flat.tableAt(try deref(v.flat, v.start + i * 4));
    }
};

// ------------------------------------------------------------------------------ schema

/// Field nodes, buffers and view-typed arrays (which take a variable number of extra
/// data buffers, listed per batch in `variadicBufferCounts`) of a field and its children.
const Layout = struct {
    nodes: u64 = 1,
    buffers: u64 = 0,
    views: u64 = 0,
};

/// Counts the IPC nodes and buffers of `field` (Schema.fbs `Field`: 0 name, 1 nullable,
/// 2 type_type, 3 type, 4 dictionary, 5 children) per the columnar format's buffer
/// layouts. Children are walked depth-first, bounded by `max_depth` and `budget`.
fn layoutOf(field: Table, depth: u32, budget: *u64) Error!Layout {
    if (budget.* == 0) return arrowFail("schema has too many fields", .{});
    budget.* -= 1;
    if (depth > max_depth) return arrowFail("schema nesting is deeper than {d} levels", .{max_depth});
    const name = try field.string(0) orelse "";
    if (try field.fieldPos(4) != null) return arrowFail("dictionary-encoded field '{s}' is not supported", .{name});

    var out: Layout = .{};
    const type_id = try field.scalar(u8, 2, TypeId.none);
    var leaf = true;
    switch (type_id) {
        TypeId.null_ => out.buffers = 0,
        TypeId.int, TypeId.floating_point, TypeId.bool_, TypeId.decimal, TypeId.date, TypeId.time, TypeId.timestamp, TypeId.interval, TypeId.fixed_size_binary, TypeId.duration => out.buffers = 2,
        TypeId.binary, TypeId.utf8, TypeId.large_binary, TypeId.large_utf8 => out.buffers = 3,
        TypeId.binary_view, TypeId.utf8_view => {
            out.buffers = 2;
            out.views = 1;
        },
        TypeId.list, TypeId.large_list, TypeId.map => {
            out.buffers = 2;
            leaf = false;
        },
        TypeId.fixed_size_list, TypeId.struct_ => {
            out.buffers = 1;
            leaf = false;
        },
        TypeId.list_view, TypeId.large_list_view => {
            out.buffers = 3;
            leaf = false;
        },
        TypeId.run_end_encoded => {
            out.buffers = 0;
            leaf = false;
        },
        TypeId.none => return arrowFail("field '{s}' has no type", .{name}),
        // Unions changed layout between V4 and V5 and never appear in metadata.
        else => return arrowFail("field '{s}' has unsupported Arrow type id {d}", .{ name, type_id }),
    }
    const children = try field.vector(5, 4);
    if (leaf) {
        if (children.len != 0) return arrowFail("field '{s}' of a primitive type has child fields", .{name});
        return out;
    }
    var i: u64 = 0;
    while (i < children.len) : (i += 1) {
        const child = try layoutOf(try children.tableAt(i), depth + 1, budget);
        // Each count is bounded by the visit budget (< 2^62), so the sums cannot overflow.
        out.nodes += child.nodes;
        out.buffers += child.buffers;
        out.views += child.views;
    }
    return out;
}

/// The `ColumnType` of a (top-level) field whose layout was already checked.
fn columnType(field: Table) Error!ColumnType {
    const type_table = try field.table(3);
    return switch (try field.scalar(u8, 2, TypeId.none)) {
        TypeId.bool_ => .bool,
        TypeId.utf8 => .utf8,
        TypeId.large_utf8 => .large_utf8,
        TypeId.int => blk: {
            // Int: 0 bitWidth (i32), 1 is_signed (bool); defaults 0 / false.
            const t = type_table orelse break :blk .other;
            const width = try t.scalar(i32, 0, 0);
            const signed = try t.scalar(bool, 1, false);
            break :blk if (width == 64 and signed) .int64 else .other;
        },
        TypeId.floating_point => blk: {
            // FloatingPoint: 0 precision (i16, HALF = 0).
            const t = type_table orelse break :blk .other;
            break :blk if (try t.scalar(i16, 0, 0) == precision_double) .float64 else .other;
        },
        else => .other,
    };
}

// ----------------------------------------------------------------------- record batches

/// File.fbs `Block` struct: offset i64 @0, metaDataLength i32 @8 (+4 padding),
/// bodyLength i64 @16.
const block_size = 24;
/// Message.fbs `FieldNode {length: i64, null_count: i64}` and Schema.fbs
/// `Buffer {offset: i64, length: i64}`.
const node_size = 16;
const buffer_size = 16;

const BatchContext = struct {
    gpa: std.mem.Allocator,
    bytes: []const u8,
    /// Record batches must end before the footer.
    limit: u64,
    fields: []const Field,
    layouts: []const Layout,
    total: Layout,
    /// End of the previous block: blocks must be disjoint and ascending.
    next_free: u64,

    /// Reads and validates record batch `index` (footer block `index`).
    fn read(ctx: *BatchContext, blocks: Vector, index: u64, first_row: u64) Error!Batch {
        const offset = try blocks.get(i64, index, 0);
        const meta_len = try blocks.get(i32, index, 8);
        const body_len_signed = try blocks.get(i64, index, 16);
        if (offset < 0 or meta_len < 0 or body_len_signed < 0 or
            @as(u64, @intCast(offset)) > ctx.limit or
            @as(u64, @intCast(meta_len)) > ctx.limit - @as(u64, @intCast(offset)) or
            @as(u64, @intCast(body_len_signed)) > ctx.limit - @as(u64, @intCast(offset)) - @as(u64, @intCast(meta_len)))
        {
            return arrowFail("record batch {d}: block (offset {d}, metadata {d} bytes, body {d} bytes) lies outside the file", .{ index, offset, meta_len, body_len_signed });
        }
        const start: u64 = @intCast(offset);
        const body_start = start + @as(u64, @intCast(meta_len));
        const body_len: u64 = @intCast(body_len_signed);
        if (start < ctx.next_free) return arrowFail("record batch {d}: blocks overlap or are out of order", .{index});
        ctx.next_free = body_start + body_len;

        // Encapsulated message: 0xFFFFFFFF then i32 size (since 0.15), or a legacy bare
        // i32 size; the flatbuffer must fit inside the block's metadata part.
        const meta = ctx.bytes[@intCast(start)..@intCast(body_start)];
        if (meta.len < 4) return arrowFail("record batch {d}: message prefix is truncated", .{index});
        var prefix: usize = 4;
        var size = std.mem.readInt(i32, meta[0..4], .little);
        if (size == -1) {
            if (meta.len < 8) return arrowFail("record batch {d}: message prefix is truncated", .{index});
            prefix = 8;
            size = std.mem.readInt(i32, meta[4..8], .little);
        }
        if (size <= 0 or @as(u64, @intCast(size)) > meta.len - prefix) {
            return arrowFail("record batch {d}: invalid message metadata size {d}", .{ index, size });
        }
        const flat: Flat = .{ .buf = meta[prefix..][0..@intCast(size)], .what = "record batch message" };

        // Message: 0 version, 1 header_type, 2 header, 3 bodyLength.
        const message = try flat.root();
        try checkVersion(try message.scalar(i16, 0, 0), "record batch message");
        const header_type = try message.scalar(u8, 1, 0);
        if (header_type != header_record_batch) {
            return arrowFail("record batch {d}: message holds header type {d}, not a record batch", .{ index, header_type });
        }
        const message_body = try message.scalar(i64, 3, 0);
        if (message_body != body_len_signed) {
            return arrowFail("record batch {d}: message body length {d} does not match the footer's {d}", .{ index, message_body, body_len_signed });
        }
        // RecordBatch: 0 length, 1 nodes, 2 buffers, 3 compression, 4 variadicBufferCounts.
        const rb = try message.table(2) orelse return arrowFail("record batch {d}: message has no header", .{index});
        if (try rb.table(3)) |compression| {
            // BodyCompression: 0 codec (i8: LZ4_FRAME = 0, ZSTD = 1). Worded as arrow-rs
            // (built without compression, like the reference) words it.
            const codec: []const u8 = switch (try compression.scalar(i8, 0, 0)) {
                0 => "lz4",
                1 => "zstd",
                else => return arrowFail("record batch {d}: unknown body compression codec", .{index}),
            };
            return arrowFail("Invalid argument error: {s} IPC decompression requires the {s} feature", .{ codec, codec });
        }
        const length_signed = try rb.scalar(i64, 0, 0);
        if (length_signed < 0) return arrowFail("record batch {d}: negative length {d}", .{ index, length_signed });
        const length: u64 = @intCast(length_signed);

        const nodes = try rb.vector(1, node_size);
        const buffers = try rb.vector(2, buffer_size);
        const variadic = try rb.vector(4, 8);
        if (nodes.len != ctx.total.nodes) {
            return arrowFail("record batch {d}: expected {d} field nodes, found {d}", .{ index, ctx.total.nodes, nodes.len });
        }
        if (variadic.len != ctx.total.views) {
            return arrowFail("record batch {d}: expected {d} variadic buffer counts, found {d}", .{ index, ctx.total.views, variadic.len });
        }
        var expected_buffers = ctx.total.buffers;
        var v: u64 = 0;
        while (v < variadic.len) : (v += 1) {
            const count = try variadic.get(i64, v, 0);
            // More buffers than the vector holds is already wrong; this also bounds the sum.
            if (count < 0 or @as(u64, @intCast(count)) > buffers.len) {
                return arrowFail("record batch {d}: invalid variadic buffer count {d}", .{ index, count });
            }
            expected_buffers += @intCast(count);
            if (expected_buffers > buffers.len) break; // reported just below
        }
        if (buffers.len != expected_buffers) {
            return arrowFail("record batch {d}: expected {d} buffers, found {d}", .{ index, expected_buffers, buffers.len });
        }
        const body = ctx.bytes[@intCast(body_start)..@intCast(body_start + body_len)];
        var cursor: u64 = 0;
        var b: u64 = 0;
        while (b < buffers.len) : (b += 1) {
            const off = try buffers.get(i64, b, 0);
            const len = try buffers.get(i64, b, 8);
            if (off < 0 or len < 0 or @as(u64, @intCast(off)) > body.len or @as(u64, @intCast(len)) > body.len - @as(u64, @intCast(off))) {
                return arrowFail("record batch {d}: buffer {d} (offset {d}, length {d}) lies outside the {d}-byte body", .{ index, b, off, len, body.len });
            }
            if (len == 0) continue;
            if (@as(u64, @intCast(off)) < cursor) return arrowFail("record batch {d}: buffer {d} overlaps the previous buffer", .{ index, b });
            cursor = @as(u64, @intCast(off)) + @as(u64, @intCast(len));
        }

        // Disjoint blocks hold disjoint node vectors, so columns allocated over all batches
        // stay below the file size / 16.
        const columns = try ctx.gpa.alloc(Column, ctx.fields.len);
        errdefer ctx.gpa.free(columns);
        var cur: Cursor = .{ .index = index, .body = body, .nodes = nodes, .buffers = buffers, .variadic = variadic };
        for (columns, ctx.fields, ctx.layouts) |*c, f, layout| {
            c.* = try cur.column(f, layout, length);
        }
        return .{ .first_row = first_row, .length = length, .columns = columns };
    }
};

/// Walks the nodes and buffers of one batch, field by field.
const Cursor = struct {
    index: u64,
    body: []const u8,
    nodes: Vector,
    buffers: Vector,
    variadic: Vector,
    node: u64 = 0,
    buffer: u64 = 0,
    view: u64 = 0,

    /// Pre: buffer `i` was checked to lie inside `body`.
    fn slice(cur: Cursor, i: u64) Error![]const u8 {
        const off: usize = @intCast(try cur.buffers.get(i64, i, 0));
        const len: usize = @intCast(try cur.buffers.get(i64, i, 8));
        return cur.body[off..][0..len];
    }

    fn column(cur: *Cursor, f: Field, layout: Layout, length: u64) Error!Column {
        const node_length = try cur.nodes.get(i64, cur.node, 0);
        const null_signed = try cur.nodes.get(i64, cur.node, 8);
        if (node_length != @as(i64, @intCast(length))) {
            return arrowFail("record batch {d}: column '{s}' has {d} rows, the batch has {d}", .{ cur.index, f.name, node_length, length });
        }
        if (null_signed < 0 or null_signed > node_length) {
            return arrowFail("record batch {d}: column '{s}' has invalid null count {d}", .{ cur.index, f.name, null_signed });
        }
        const null_count: u64 = @intCast(null_signed);
        const first = cur.buffer;
        cur.node += layout.nodes;
        cur.buffer += layout.buffers;
        var v: u64 = 0;
        while (v < layout.views) : (v += 1) {
            cur.buffer += @intCast(try cur.variadic.get(i64, cur.view, 0));
            cur.view += 1;
        }
        var c: Column = .{ .type = f.type, .len = length, .validity = null, .null_count = null_count, .values = "", .offsets = "" };
        if (f.type == .other) return c;

        // Every supported type starts with the validity bitmap.
        if (null_count > 0) {
            const bits = try cur.slice(first);
            if (bits.len < bitmapBytes(length)) return cur.tooShort(f, "validity bitmap", bits.len, length);
            if (countNulls(bits, length) != null_count) {
                return arrowFail("record batch {d}: column '{s}' null count {d} does not match its validity bitmap", .{ cur.index, f.name, null_count });
            }
            c.validity = bits;
        }
        c.values = try cur.slice(first + 1);
        switch (f.type) {
            .bool => if (c.values.len < bitmapBytes(length)) return cur.tooShort(f, "values", c.values.len, length),
            .int64, .float64 => if (c.values.len / 8 < length) return cur.tooShort(f, "values", c.values.len, length),
            .utf8 => {
                c.offsets = c.values;
                c.values = try cur.slice(first + 2);
                try cur.checkStrings(f, c, i32);
            },
            .large_utf8 => {
                c.offsets = c.values;
                c.values = try cur.slice(first + 2);
                try cur.checkStrings(f, c, i64);
            },
            .other => unreachable,
        }
        return c;
    }

    /// Offsets in range and non-decreasing, non-null strings valid UTF-8. O(len).
    fn checkStrings(cur: Cursor, f: Field, c: Column, comptime Offset: type) Error!void {
        if (c.len == 0) return; // a 0-row column may omit its offsets entirely
        const width = @sizeOf(Offset);
        if (c.offsets.len / width <= c.len) return cur.tooShort(f, "offsets", c.offsets.len, c.len);
        var prev = offsetAt(Offset, c.offsets, 0);
        if (prev < 0 or prev > c.values.len) {
            return arrowFail("record batch {d}: column '{s}' offset {d} at row 0 is outside the {d}-byte data", .{ cur.index, f.name, prev, c.values.len });
        }
        var row: u64 = 0;
        while (row < c.len) : (row += 1) {
            const next = offsetAt(Offset, c.offsets, row + 1);
            if (next < prev or next > c.values.len) {
                return arrowFail("record batch {d}: column '{s}' string offsets are not monotonic or exceed the {d}-byte data at row {d}", .{ cur.index, f.name, c.values.len, row });
            }
            const text = c.values[@intCast(prev)..@intCast(next)];
            if (!c.isNull(row) and !std.unicode.utf8ValidateSlice(text)) {
                return arrowFail("record batch {d}: column '{s}' row {d} is not valid UTF-8", .{ cur.index, f.name, row });
            }
            prev = next;
        }
    }

    fn tooShort(cur: Cursor, f: Field, comptime what: []const u8, have: usize, rows: u64) Error {
        return arrowFail("record batch {d}: column '{s}' " ++ what ++ " buffer is too short ({d} bytes for {d} rows)", .{ cur.index, f.name, have, rows });
    }
};

fn bitmapBytes(rows: u64) u64 {
    return rows / 8 + @intFromBool(rows % 8 != 0);
}

fn bitAt(bits: []const u8, i: u64) bool {
    return (bits[@intCast(i / 8)] >> @intCast(i % 8)) & 1 != 0;
}

/// Pre: `i < offsets.len / @sizeOf(T)`.
fn offsetAt(comptime T: type, offsets: []const u8, i: u64) T {
    const at: usize = @intCast(i * @sizeOf(T));
    return std.mem.readInt(T, offsets[at..][0..@sizeOf(T)], .little);
}

/// Zero bits among the first `rows` bits. Pre: `bits.len >= bitmapBytes(rows)`.
fn countNulls(bits: []const u8, rows: u64) u64 {
    const full: usize = @intCast(rows / 8);
    var valid: u64 = 0;
    for (bits[0..full]) |byte| valid += @popCount(byte);
    const rest: u3 = @intCast(rows % 8);
    if (rest != 0) {
        const mask = (@as(u8, 1) << rest) - 1;
        valid += @popCount(bits[full] & mask);
    }
    return rows - valid;
}

// =============================================================================== tests
//
// The sample files at the bottom of this file were written by pyarrow 26, polars 1.x and
// (the fixture) arrow-rs via the dataset-rt 0.4.8 reference; each literal says how.

const testing = std.testing;

/// Decodes a multi-line base64 literal. Caller frees.
fn sample(comptime text: []const u8) ![]u8 {
    var clean: [text.len]u8 = undefined;
    var n: usize = 0;
    for (text) |ch| {
        if (ch == '\n') continue;
        clean[n] = ch;
        n += 1;
    }
    const decoder = std.base64.standard.Decoder;
    const out = try testing.allocator.alloc(u8, try decoder.calcSizeForSlice(clean[0..n]));
    errdefer testing.allocator.free(out);
    try decoder.decode(out, clean[0..n]);
    return out;
}

fn expectFail(expected: Error, message: []const u8, bytes: []const u8) !void {
    try expectParseError(expected, bytes);
    try testing.expectEqualStrings(message, status.lastMessage());
}

fn expectArrowError(needle: []const u8, bytes: []const u8) !void {
    try expectParseError(error.Arrow, bytes);
    const msg = status.lastMessage();
    if (!std.mem.startsWith(u8, msg, "Arrow error: ") or std.mem.indexOf(u8, msg, needle) == null) {
        std.debug.print("unexpected message: {s}\n", .{msg});
        return error.TestUnexpectedResult;
    }
}

fn expectParseError(expected: Error, bytes: []const u8) !void {
    if (File.parse(testing.allocator, bytes)) |ok| {
        var f = ok;
        f.deinit(testing.allocator);
        return error.TestExpectedError;
    } else |err| try testing.expectEqual(expected, err);
}

/// A test file decoded from base64 and parsed (the parsed File borrows the bytes).
const Parsed = struct {
    bytes: []u8,
    file: File,

    fn init(comptime b64: []const u8) !Parsed {
        const bytes = try sample(b64);
        errdefer testing.allocator.free(bytes);
        return .{ .bytes = bytes, .file = try File.parse(testing.allocator, bytes) };
    }

    fn deinit(p: *Parsed) void {
        p.file.deinit(testing.allocator);
        testing.allocator.free(p.bytes);
    }
};

fn expectFields(f: File, expected: []const Field) !void {
    try testing.expectEqual(expected.len, f.fields.len);
    for (expected, f.fields) |e, a| {
        try testing.expectEqualStrings(e.name, a.name);
        try testing.expectEqual(e.type, a.type);
        try testing.expectEqual(e.nullable, a.nullable);
    }
}

/// Reads every value of every column through the accessors (and `locate`), so a file
/// `parse` accepted is proven readable. Returns a checksum that keeps the reads alive.
fn touchAll(f: File) u64 {
    var sum: u64 = 0;
    var rows: u64 = 0;
    for (f.batches) |b| {
        std.debug.assert(b.first_row == rows);
        rows += b.length;
        for (b.columns) |c| {
            std.debug.assert(c.len == b.length);
            var r: u64 = 0;
            while (r < c.len and c.type != .other) : (r += 1) {
                sum +%= @intFromBool(c.isNull(r));
                switch (c.type) {
                    .bool => sum +%= @intFromBool(c.getBool(r)),
                    .int64 => sum +%= @bitCast(c.getInt(r)),
                    .float64 => sum +%= @bitCast(c.getFloat(r)),
                    .utf8, .large_utf8 => sum +%= c.getString(r).len,
                    .other => unreachable,
                }
            }
        }
    }
    std.debug.assert(rows == f.row_count);
    if (f.row_count > 0) {
        for ([_]u64{ 0, f.row_count / 2, f.row_count - 1 }) |row| {
            const loc = f.locate(row);
            std.debug.assert(loc.index < f.batches[loc.batch].length);
            std.debug.assert(f.batches[loc.batch].first_row + loc.index == row);
        }
    }
    return sum;
}

test "arrow-rs file written by the reference release (fixture plain_one_shard)" {
    var f_owner = try Parsed.init(fixture_b64);
    defer f_owner.deinit();
    const f = f_owner.file;
    try expectFields(f, &.{
        .{ .name = "flag", .type = .bool, .nullable = false },
        .{ .name = "label", .type = .int64, .nullable = false },
        .{ .name = "name", .type = .utf8, .nullable = false },
        .{ .name = "score", .type = .float64, .nullable = false },
    });
    try testing.expectEqual(@as(u64, 120), f.row_count);
    try testing.expectEqual(@as(usize, 1), f.batches.len);
    const cols = f.batches[0].columns;
    // arrow-rs stores all-ones validity bitmaps for non-null columns: they are ignored.
    for (cols) |c| {
        try testing.expect(c.validity == null);
        try testing.expectEqual(@as(u64, 0), c.null_count);
    }
    var buf: [64]u8 = undefined;
    for (0..120) |i| {
        const row: u64 = i;
        try testing.expectEqual(i % 2 == 0, cols[0].getBool(row));
        try testing.expectEqual(@as(i64, @intCast(i % 7)) - 3, cols[1].getInt(row));
        try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "item-{d}-é中", .{i}), cols[2].getString(row));
        try testing.expectEqual(@as(f64, @floatFromInt(i)) / 3.0, cols[3].getFloat(row));
        try testing.expect(!cols[0].isNull(row));
    }
    try testing.expectEqual(@as(?schema.Kind, .string), f.fields[2].type.kind());
    try testing.expectEqual(@as(u64, 119), f.locate(119).index);
}

test "pyarrow file with all four kinds and extreme values" {
    var f_owner = try Parsed.init(all4_b64);
    defer f_owner.deinit();
    const f = f_owner.file;
    try expectFields(f, &.{
        .{ .name = "flag", .type = .bool, .nullable = false },
        .{ .name = "label", .type = .int64, .nullable = false },
        .{ .name = "name", .type = .utf8, .nullable = false },
        .{ .name = "score", .type = .float64, .nullable = false },
    });
    try testing.expectEqual(@as(u64, 5), f.row_count);
    const c = f.batches[0].columns;
    const flags = [_]bool{ true, false, true, true, false };
    const labels = [_]i64{ 0, -1, std.math.maxInt(i64), std.math.minInt(i64), 42 };
    const names = [_][]const u8{ "a", "", "héllo", "zz", "x" };
    for (0..5) |i| {
        try testing.expectEqual(flags[i], c[0].getBool(i));
        try testing.expectEqual(labels[i], c[1].getInt(i));
        try testing.expectEqualStrings(names[i], c[2].getString(i));
    }
    try testing.expectEqual(@as(f64, 0.5), c[3].getFloat(0));
    try testing.expect(std.math.signbit(c[3].getFloat(1)) and c[3].getFloat(1) == 0);
    try testing.expect(std.math.isPositiveInf(c[3].getFloat(2)));
    try testing.expect(std.math.isNan(c[3].getFloat(3)));
    try testing.expectEqual(@as(f64, 1e300), c[3].getFloat(4));
}

test "several batches, an empty batch in the middle, nullable columns with nulls" {
    var f_owner = try Parsed.init(multi_b64);
    defer f_owner.deinit();
    const f = f_owner.file;
    try expectFields(f, &.{
        .{ .name = "b", .type = .bool, .nullable = true },
        .{ .name = "i", .type = .int64, .nullable = true },
        .{ .name = "s", .type = .utf8, .nullable = true },
        .{ .name = "f", .type = .float64, .nullable = true },
    });
    try testing.expectEqual(@as(u64, 5), f.row_count);
    try testing.expectEqual(@as(usize, 3), f.batches.len);
    try testing.expectEqual(@as(u64, 2), f.batches[0].length);
    try testing.expectEqual(@as(u64, 0), f.batches[1].length);
    try testing.expectEqual(@as(u64, 3), f.batches[2].length);
    try testing.expectEqual(@as(u64, 2), f.batches[2].first_row);

    // Rows: b [T, null | F, T, null], i [1, null | 7, 8, 9], s ["x", null | "p", "qq", "rrr"],
    // f [null, 2.5 | 3, 4, 5].
    const b0 = f.batches[0].columns;
    try testing.expectEqual(@as(u64, 1), b0[0].null_count);
    try testing.expect(b0[0].getBool(0) and !b0[0].isNull(0) and b0[0].isNull(1));
    try testing.expect(b0[1].getInt(0) == 1 and b0[1].isNull(1));
    try testing.expect(b0[2].isNull(1) and !b0[2].isNull(0));
    try testing.expectEqualStrings("x", b0[2].getString(0));
    try testing.expect(b0[3].isNull(0) and b0[3].getFloat(1) == 2.5);
    const b2 = f.batches[2].columns;
    try testing.expect(b2[1].validity == null);
    try testing.expectEqual(@as(i64, 9), b2[1].getInt(2));
    try testing.expectEqualStrings("qq", b2[2].getString(1));
    try testing.expect(!b2[0].getBool(0) and b2[0].getBool(1) and b2[0].isNull(2));

    // locate skips the empty batch.
    const expected = [_][2]u64{ .{ 0, 0 }, .{ 0, 1 }, .{ 2, 0 }, .{ 2, 1 }, .{ 2, 2 } };
    for (expected, 0..) |e, row| {
        const loc = f.locate(row);
        try testing.expectEqual(@as(usize, @intCast(e[0])), loc.batch);
        try testing.expectEqual(e[1], loc.index);
    }
}

test "0 rows: no batch at all, and a single empty batch" {
    const none = try sample(nobatch_b64);
    defer testing.allocator.free(none);
    var f = try File.parse(testing.allocator, none);
    try testing.expectEqual(@as(u64, 0), f.row_count);
    try testing.expectEqual(@as(usize, 0), f.batches.len);
    try testing.expectEqual(@as(usize, 4), f.fields.len);
    f.deinit(testing.allocator);

    var g_owner = try Parsed.init(zerorow_b64);
    defer g_owner.deinit();
    const g = g_owner.file;
    try testing.expectEqual(@as(u64, 0), g.row_count);
    try testing.expectEqual(@as(usize, 1), g.batches.len);
    try testing.expectEqual(ColumnType.utf8, g.fields[0].type);
    try testing.expectEqual(@as(u64, 0), g.batches[0].columns[0].len);
}

test "a sliced batch reads as its own rows" {
    var f_owner = try Parsed.init(sliced_b64);
    defer f_owner.deinit();
    const f = f_owner.file;
    try testing.expectEqual(@as(u64, 9), f.row_count);
    const c = f.batches[0].columns;
    var buf: [8]u8 = undefined;
    for (0..9) |r| {
        const i = r + 5; // the table was sliced at 5
        try testing.expectEqual(i % 3 == 0, c[0].getBool(r));
        try testing.expectEqual(@as(i64, @intCast(i)), c[1].getInt(r));
        try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "n{d}", .{i}), c[2].getString(r));
        try testing.expectEqual(@as(f64, @floatFromInt(i)) / 4.0, c[3].getFloat(r));
    }
}

test "large_utf8 is reported (and readable); string_view and other types are .other" {
    var f_owner = try Parsed.init(large_b64);
    defer f_owner.deinit();
    const f = f_owner.file;
    try testing.expectEqual(ColumnType.large_utf8, f.fields[0].type);
    try testing.expectEqual(@as(?schema.Kind, null), f.fields[0].type.kind());
    try testing.expectEqualStrings("c", f.batches[0].columns[0].getString(1));
    try testing.expectEqual(@as(i64, 2), f.batches[0].columns[1].getInt(1));

    // polars writes string_view (with variadic data buffers) by default.
    var g_owner = try Parsed.init(polars_b64);
    defer g_owner.deinit();
    const g = g_owner.file;
    try expectFields(g, &.{ .{ .name = "s", .type = .other, .nullable = true }, .{ .name = "i", .type = .int64, .nullable = true } });
    try testing.expectEqual(@as(usize, 0), g.batches[0].columns[0].values.len);
    try testing.expectEqual(@as(i64, 1), g.batches[0].columns[1].getInt(0));

    // Nested and other unsupported columns are skipped node by node, buffer by buffer, so
    // the supported columns after them are still found.
    var h_owner = try Parsed.init(nested_b64);
    defer h_owner.deinit();
    const h = h_owner.file;
    for (h.fields[0..5]) |fl| try testing.expectEqual(ColumnType.other, fl.type);
    try testing.expectEqualStrings("i32", h.fields[4].name);
    const c = h.batches[0].columns;
    try testing.expectEqual(@as(i64, 30), c[5].getInt(2));
    try testing.expectEqualStrings("www", c[6].getString(2));
    try testing.expectEqual(@as(u64, 1), c[0].null_count); // the list's null row
}

test "unsupported or foreign inputs are rejected with clear errors" {
    const lz4 = try sample(polars_lz4_b64);
    defer testing.allocator.free(lz4);
    try expectFail(error.Arrow, "Arrow error: Invalid argument error: lz4 IPC decompression requires the lz4 feature", lz4);

    const zstd = try sample(zstd_b64);
    defer testing.allocator.free(zstd);
    try expectFail(error.Arrow, "Arrow error: Invalid argument error: zstd IPC decompression requires the zstd feature", zstd);

    const dict = try sample(dict_b64);
    defer testing.allocator.free(dict);
    try expectFail(error.Arrow, "Arrow error: dictionary-encoded field 'd' is not supported", dict);

    // An IPC stream (0xFFFFFFFF continuation first, no magic) is not a file.
    const stream = try sample(stream_b64);
    defer testing.allocator.free(stream);
    try expectFail(error.InvalidCache, "invalid metadata Arrow footer", stream);
    try expectFail(error.InvalidCache, "invalid metadata Arrow footer", "");
    try expectFail(error.InvalidCache, "invalid metadata Arrow footer", "ARROW");

    // Garbage as tests/test_load_errors.py writes it.
    var garbage: [600]u8 = undefined;
    for (&garbage, 0..) |*b, i| b.* = @truncate(i * 37 + 11);
    try expectFail(error.InvalidCache, "invalid metadata Arrow footer", &garbage);
}

test "a truncated file is an Arrow parser error, like the reference" {
    const bytes = try sample(fixture_b64);
    defer testing.allocator.free(bytes);
    const footer = "Arrow error: Parser error: Arrow file does not contain correct footer";
    try expectFail(error.Arrow, footer, bytes[0 .. bytes.len - 10]);
    try expectFail(error.Arrow, footer, bytes[0 .. bytes.len - 1]);
    try expectFail(error.Arrow, footer, "ARROW1");
    try expectFail(error.Arrow, footer, bytes[0 .. bytes.len / 2]);
}

test "a footer length or footer the reference cannot use is an Arrow parser error" {
    const bytes = try sample(fixture_b64);
    const copy = try testing.allocator.dupe(u8, bytes);
    defer testing.allocator.free(copy);
    defer testing.allocator.free(bytes);
    const at = bytes.len - 10;
    const footer_len = std.mem.readInt(i32, bytes[at..][0..4], .little);
    // Magic at both ends but a length that points outside the file (or is zero): 0.4.8's
    // validated open raises an Arrow parser error, as for a negative one.
    const unfit = "Parser error: Unable to get root as footer: a footer length of ";
    try expectArrowError(unfit, "ARROW1\x00\x00\xff\xff\xff\x7fARROW1");
    try expectArrowError(unfit, "ARROW1\x00\x00\x00\x00\x00\x00ARROW1");
    for ([_]i32{ 0, @intCast(bytes.len - 17), std.math.maxInt(i32) }) |len| {
        std.mem.writeInt(i32, copy[at..][0..4], len, .little);
        try expectArrowError(unfit, copy);
    }
    std.mem.writeInt(i32, copy[at..][0..4], -1, .little);
    try expectFail(error.Arrow, "Arrow error: Parser error: Invalid footer length: -1", copy);
    // A length within the file that does not frame a valid footer flatbuffer.
    std.mem.writeInt(i32, copy[at..][0..4], 1, .little);
    try expectFail(error.Arrow, "Arrow error: Parser error: Unable to get root as footer: malformed flatbuffer: offset out of bounds", copy);
    std.mem.writeInt(i32, copy[at..][0..4], footer_len, .little);
    var f = try File.parse(testing.allocator, copy);
    f.deinit(testing.allocator);
}

/// Test helper: the footer's record-batch Block vector of `bytes` (a valid file) and
/// where the footer starts (vector positions are relative to it).
fn footerBlocks(bytes: []const u8) !struct { Vector, usize } {
    const len: usize = @intCast(std.mem.readInt(i32, bytes[bytes.len - 10 ..][0..4], .little));
    const start = bytes.len - 10 - len;
    const flat: Flat = .{ .buf = bytes[start .. bytes.len - 10], .what = "footer" };
    return .{ try (try flat.root()).vector(3, block_size), start };
}

/// Position in `bytes` of `part`, which points into it.
fn posIn(bytes: []const u8, part: []const u8) usize {
    return @intFromPtr(part.ptr) - @intFromPtr(bytes.ptr);
}

test "structural corruption inside the file is detected" {
    const gpa = testing.allocator;
    const original = try sample(multi_b64);
    defer gpa.free(original);
    const bytes = try gpa.dupe(u8, original);
    defer gpa.free(bytes);
    var f = try File.parse(gpa, original);
    defer f.deinit(gpa);
    const s0 = f.batches[0].columns[2]; // utf8 "x", null
    const s2 = f.batches[2].columns[2]; // utf8 "p", "qq", "rrr"

    // Decreasing utf8 offsets.
    @memcpy(bytes, original);
    std.mem.writeInt(i32, bytes[posIn(original, s2.offsets) + 8 ..][0..4], 0, .little);
    try expectArrowError("not monotonic", bytes);

    // Last offset beyond the string data.
    @memcpy(bytes, original);
    std.mem.writeInt(i32, bytes[posIn(original, s2.offsets) + 12 ..][0..4], 1000, .little);
    try expectArrowError("exceed the 6-byte data", bytes);

    // Negative first offset.
    @memcpy(bytes, original);
    std.mem.writeInt(i32, bytes[posIn(original, s2.offsets)..][0..4], -1, .little);
    try expectArrowError("offset -1 at row 0", bytes);

    // Invalid UTF-8 in a non-null string.
    @memcpy(bytes, original);
    bytes[posIn(original, s2.values) + 1] = 0xff;
    try expectArrowError("is not valid UTF-8", bytes);

    // Validity bitmap disagreeing with the null count.
    @memcpy(bytes, original);
    bytes[posIn(original, s0.validity.?)] = 0xff;
    try expectArrowError("does not match its validity bitmap", bytes);

    // Blocks that overlap / alias one another.
    @memcpy(bytes, original);
    const blocks, const footer_start = try footerBlocks(original);
    const at: usize = footer_start + @as(usize, @intCast(blocks.start));
    @memcpy(bytes[at + block_size ..][0..8], original[at..][0..8]);
    try expectArrowError("blocks overlap or are out of order", bytes);

    // A block whose body runs past the footer.
    @memcpy(bytes, original);
    std.mem.writeInt(i64, bytes[at + 2 * block_size + 16 ..][0..8], 1 << 40, .little);
    try expectArrowError("lies outside the file", bytes);

    // A block pointing at the schema message instead of a record batch.
    @memcpy(bytes, original);
    std.mem.writeInt(i64, bytes[at..][0..8], 8, .little);
    try expectArrowError("not a record batch", bytes);
}

test "buffer extents, counts and versions in the batch message are checked" {
    const gpa = testing.allocator;
    const original = try sample(all4_b64);
    defer gpa.free(original);
    const bytes = try gpa.dupe(u8, original);
    defer gpa.free(bytes);

    // Locate the record batch message and its buffer list with the module's own reader.
    const blocks, _ = try footerBlocks(original);
    const off: usize = @intCast(try blocks.get(i64, 0, 0));
    const size: usize = @intCast(std.mem.readInt(i32, original[off + 4 ..][0..4], .little));
    const flat: Flat = .{ .buf = original[off + 8 ..][0..size], .what = "test" };
    const message = try flat.root();
    const rb = (try message.table(2)).?;
    const buffers = try rb.vector(2, buffer_size);
    const nodes = try rb.vector(1, node_size);
    const base = off + 8;
    try testing.expectEqual(@as(u64, 9), buffers.len); // validity + values, + values, + offsets + data, + values

    // int64 values buffer (buffer 3) longer than the body.
    @memcpy(bytes, original);
    std.mem.writeInt(i64, bytes[@intCast(base + buffers.start + 3 * buffer_size + 8)..][0..8], 1 << 20, .little);
    try expectArrowError("lies outside the", bytes);

    // int64 values buffer too short for 5 rows.
    @memcpy(bytes, original);
    std.mem.writeInt(i64, bytes[@intCast(base + buffers.start + 3 * buffer_size + 8)..][0..8], 39, .little);
    try expectArrowError("column 'label' values buffer is too short (39 bytes for 5 rows)", bytes);

    // Two buffers claiming the same bytes.
    @memcpy(bytes, original);
    const b5 = bytes[@intCast(base + buffers.start + 5 * buffer_size)..][0..8];
    @memcpy(b5, original[@intCast(base + buffers.start + 3 * buffer_size)..][0..8]);
    try expectArrowError("overlaps the previous buffer", bytes);

    // Fewer buffers than the schema needs.
    @memcpy(bytes, original);
    std.mem.writeInt(u32, bytes[@intCast(base + buffers.start - 4)..][0..4], 8, .little);
    try expectArrowError("expected 9 buffers, found 8", bytes);

    // A node whose length differs from the batch's.
    @memcpy(bytes, original);
    std.mem.writeInt(i64, bytes[@intCast(base + nodes.start + node_size)..][0..8], 4, .little);
    try expectArrowError("column 'label' has 4 rows, the batch has 5", bytes);

    // Null count larger than the row count.
    @memcpy(bytes, original);
    std.mem.writeInt(i64, bytes[@intCast(base + nodes.start + 8)..][0..8], 6, .little);
    try expectArrowError("column 'flag' has invalid null count 6", bytes);

    // Message version V3 (value 2).
    @memcpy(bytes, original);
    const version_at = (try message.fieldPos(0)).?;
    std.mem.writeInt(i16, bytes[@intCast(base + version_at)..][0..2], 2, .little);
    try expectArrowError("unsupported metadata version 3 in record batch message", bytes);

    // A vtable offset pointing before the buffer.
    @memcpy(bytes, original);
    std.mem.writeInt(i32, bytes[@intCast(base + rb.pos)..][0..4], 0x7fff_0000, .little);
    try expectArrowError("malformed record batch message flatbuffer", bytes);
}

/// Test helper: an IPC file with no batch whose schema is one chain of `depth` nested
/// struct fields ending in an Int leaf, where every level's children vector holds
/// `fanout` references to the *same* next field (aliasing the flatbuffer allows). A naive
/// walk would visit fanout^(depth-1) fields. Caller frees.
fn nestedSchemaFile(gpa: std.mem.Allocator, fanout: u32, depth: u32) ![]u8 {
    var out: std.ArrayList(u8) = .empty;
    errdefer out.deinit(gpa);
    const put = struct {
        fn int(o: *std.ArrayList(u8), g: std.mem.Allocator, comptime T: type, v: T) !void {
            var b: [@sizeOf(T)]u8 = undefined;
            std.mem.writeInt(T, &b, v, .little);
            try o.appendSlice(g, &b);
        }
    }.int;
    try out.appendSlice(gpa, "ARROW1\x00\x00");
    const base = out.items.len; // footer positions below are relative to this
    try put(&out, gpa, u32, 16); // root: Footer table at 16, its vtable at 4
    for ([_]u16{ 12, 12, 4, 8, 0, 0 }) |v| try put(&out, gpa, u16, v); // Footer vtable
    try put(&out, gpa, i32, 12); // @16 Footer: soffset to the vtable at 4
    try put(&out, gpa, i16, version_v5);
    try put(&out, gpa, u16, 0);
    try put(&out, gpa, u32, 36 - 24); // @24 schema -> table at 36
    for ([_]u16{ 8, 8, 0, 4 }) |v| try put(&out, gpa, u16, v); // @28 Schema vtable
    try put(&out, gpa, i32, 8); // @36 Schema table
    try put(&out, gpa, u32, 44 - 40); // @40 fields -> vector at 44
    try put(&out, gpa, u32, 1); // @44 one top-level field
    try put(&out, gpa, u32, 52 + 16 - 48); // @48 -> first Field table
    for (0..depth) |level| {
        // Field at p: 16-byte vtable (ids 0..5: type_type at +4, children at +8), then the
        // table (soffset, type_type, padding, children offset) and the children vector.
        const p = out.items.len - base;
        const leaf = level + 1 == depth;
        for ([_]u16{ 16, 12, 0, 0, 4, 0, 0, if (leaf) 0 else 8 }) |v| try put(&out, gpa, u16, v);
        try put(&out, gpa, i32, 16);
        try put(&out, gpa, u32, if (leaf) TypeId.int else TypeId.struct_);
        try put(&out, gpa, u32, 4);
        const n: u32 = if (leaf) 0 else fanout;
        try put(&out, gpa, u32, n);
        const next = p + 32 + 4 * @as(usize, n);
        for (0..n) |k| try put(&out, gpa, u32, @intCast(next + 16 - (p + 32 + 4 * k)));
    }
    try put(&out, gpa, i32, @intCast(out.items.len - base));
    try out.appendSlice(gpa, "ARROW1");
    return out.toOwnedSlice(gpa);
}

test "aliased or deeply nested schemas are bounded" {
    const gpa = testing.allocator;
    // Sanity: the hand-built file parses when small.
    const small = try nestedSchemaFile(gpa, 2, 4);
    defer gpa.free(small);
    var f = try File.parse(gpa, small);
    try testing.expectEqual(ColumnType.other, f.fields[0].type);
    try testing.expectEqual(@as(u64, 0), f.row_count);
    f.deinit(gpa);
    var budget: u64 = 100;
    const flat: Flat = .{ .buf = small[8 .. small.len - 10], .what = "footer" };
    const field = try (try (try (try flat.root()).table(1)).?.vector(1, 4)).tableAt(0);
    const layout = try layoutOf(field, 0, &budget);
    try testing.expectEqual(@as(u64, 1 + 2 * (1 + 2 * (1 + 2))), layout.nodes);

    // 64^5 paths through 6 levels: stopped by the visit budget, not walked.
    const wide = try nestedSchemaFile(gpa, 64, 6);
    defer gpa.free(wide);
    try expectFail(error.Arrow, "Arrow error: schema has too many fields", wide);

    const deep = try nestedSchemaFile(gpa, 1, 100);
    defer gpa.free(deep);
    try expectFail(error.Arrow, "Arrow error: schema nesting is deeper than 64 levels", deep);
}

test "allocation failures leak nothing" {
    const bytes = try sample(multi_b64);
    defer testing.allocator.free(bytes);
    try testing.checkAllAllocationFailures(testing.allocator, struct {
        fn run(gpa: std.mem.Allocator, b: []const u8) !void {
            var f = File.parse(gpa, b) catch |err| switch (err) {
                error.OutOfMemory => return error.OutOfMemory,
                else => return error.TestUnexpectedResult,
            };
            f.deinit(gpa);
        }
    }.run, .{bytes});
}

/// One random corruption of `input` (flip, overwrite, 32-bit poke, cut, insert, extend,
/// truncate or copy a range). Half of the positions target the footer and the messages'
/// metadata, where structure lives. Caller frees.
fn mutate(gpa: std.mem.Allocator, rand: std.Random, input: []const u8) ![]u8 {
    var out: std.ArrayList(u8) = .empty;
    errdefer out.deinit(gpa);
    try out.appendSlice(gpa, input);
    const rounds = 1 + rand.uintLessThan(u32, 3);
    for (0..rounds) |_| {
        const len = out.items.len;
        if (len == 0) {
            try out.append(gpa, rand.int(u8));
            continue;
        }
        const tail_start = len - @min(len, 400);
        const pos = if (rand.boolean()) tail_start + rand.uintLessThan(usize, len - tail_start) else rand.uintLessThan(usize, len);
        switch (rand.uintLessThan(u32, 8)) {
            0 => out.items[pos] ^= @as(u8, 1) << rand.int(u3),
            1 => out.items[pos] = switch (rand.uintLessThan(u32, 4)) {
                0 => 0,
                1 => 0xff,
                2 => 0x80,
                else => rand.int(u8),
            },
            2 => if (pos + 4 <= len) {
                const values = [_]u32{ 0, 1, 4, 8, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff, 0xffff_fff8, @intCast(len & 0xffff_ffff) };
                std.mem.writeInt(u32, out.items[pos..][0..4], values[rand.uintLessThan(usize, values.len)], .little);
            },
            3 => {
                const n = @min(len - pos, 1 + rand.uintLessThan(usize, 64));
                try out.replaceRange(gpa, pos, n, &.{});
            },
            4 => {
                var extra: [16]u8 = undefined;
                rand.bytes(&extra);
                try out.insertSlice(gpa, pos, extra[0 .. 1 + rand.uintLessThan(usize, extra.len)]);
            },
            5 => {
                var extra: [16]u8 = undefined;
                rand.bytes(&extra);
                try out.appendSlice(gpa, extra[0 .. 1 + rand.uintLessThan(usize, extra.len)]);
            },
            6 => out.shrinkRetainingCapacity(pos),
            else => {
                const from = rand.uintLessThan(usize, len);
                const n = @min(len - pos, len - from, 1 + rand.uintLessThan(usize, 24));
                std.mem.copyForwards(u8, out.items[pos..][0..n], out.items[from..][0..n]);
            },
        }
    }
    return out.toOwnedSlice(gpa);
}

test "fuzz: corrupted files parse to an error or to fully readable columns" {
    const gpa = testing.allocator;
    const texts = [_][]const u8{ fixture_b64, all4_b64, multi_b64, nobatch_b64, zerorow_b64, sliced_b64, large_b64, polars_b64, nested_b64, polars_lz4_b64, dict_b64 };
    var prng = std.Random.DefaultPrng.init(0x4152_524f_5731);
    const rand = prng.random();
    var accepted: usize = 0;
    var checksum: u64 = 0;
    inline for (texts) |text| {
        const original = try sample(text);
        defer gpa.free(original);
        for (0..2500) |_| {
            const bytes = try mutate(gpa, rand, original);
            defer gpa.free(bytes);
            var f = File.parse(gpa, bytes) catch |err| {
                const msg = status.lastMessage();
                switch (err) {
                    error.Arrow => try testing.expect(std.mem.startsWith(u8, msg, "Arrow error: ")),
                    error.InvalidCache => try testing.expectEqualStrings("invalid metadata Arrow footer", msg),
                    else => return err,
                }
                continue;
            };
            defer f.deinit(gpa);
            accepted += 1;
            checksum +%= touchAll(f);
        }
    }
    // Data-byte flips keep many files valid, so both paths are exercised.
    try testing.expect(accepted > 1000);
    std.mem.doNotOptimizeAway(checksum);
}

// ------------------------------------------------------------------------ sample files

/// arrow-rs (dataset-rt 0.4.8 reference writer): tests/fixtures/dataset-rt-0.4.8/plain_one_shard/metadata.arrow, 120 rows
const fixture_b64 =
    \\QVJST1cxAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAP////84AQAA
    \\EAAAAAAACgAMAAoACQAEAAoAAAAQAAAAAAEEAAgACAAAAAQACAAAAAQAAAAEAAAAxAAAAHgAAABMAAAAFAAAABAAFgAQAAAA
    \\DwAEAAAACAAQAAAAGAAAABwAAAAAAAADGAAAAAAABgAIAAYABgAAAAAAAgAAAAAABQAAAHNjb3JlAAAAoP///xQAAAAMAAAA
    \\AAAABQwAAAAAAAAAkP///wQAAABuYW1lAAAAAMj///8YAAAAIAAAAAAAAAIcAAAACAAMAAQACwAIAAAAQAAAAAAAAAEAAAAA
    \\BQAAAGxhYmVsAAAAEAAUABAAAAAPAAQAAAAIABAAAAAYAAAADAAAAAAAAAYQAAAAAAAAAAQABAAEAAAABAAAAGZsYWcAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/////zgBAAAQAAAADAAaABgAFwAEAAgADAAAACAAAAAAEQAAAAAAAAAAAAAAAAAD
    \\BAAKABgADAAIAAQACgAAAFwAAAAQAAAAeAAAAAAAAAAAAAAABAAAAHgAAAAAAAAAAAAAAAAAAAB4AAAAAAAAAAAAAAAAAAAA
    \\eAAAAAAAAAAAAAAAAAAAAHgAAAAAAAAAAAAAAAAAAAAAAAAACQAAAAAAAAAAAAAADwAAAAAAAABAAAAAAAAAAA8AAAAAAAAA
    \\gAAAAAAAAAAPAAAAAAAAAMAAAAAAAAAAwAMAAAAAAACABAAAAAAAAA8AAAAAAAAAwAQAAAAAAADkAQAAAAAAAMAGAAAAAAAA
    \\IgYAAAAAAAAADQAAAAAAAA8AAAAAAAAAQA0AAAAAAADAAwAAAAAAAAAAAAAAAAAAAAAAAAAAAAD///////////////////8A
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAVVVVVVVVVVVVVVVVVVVVAAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAP///////////////////wAAAAAAAAAAAAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAD9//////////7///////////////////8AAAAAAAAAAAEAAAAAAAAA
    \\AgAAAAAAAAADAAAAAAAAAP3//////////v///////////////////wAAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAMAAAAAAAAA
    \\/f/////////+////////////////////AAAAAAAAAAABAAAAAAAAAAIAAAAAAAAAAwAAAAAAAAD9//////////7/////////
    \\//////////8AAAAAAAAAAAEAAAAAAAAAAgAAAAAAAAADAAAAAAAAAP3//////////v///////////////////wAAAAAAAAAA
    \\AQAAAAAAAAACAAAAAAAAAAMAAAAAAAAA/f/////////+////////////////////AAAAAAAAAAABAAAAAAAAAAIAAAAAAAAA
    \\AwAAAAAAAAD9//////////7///////////////////8AAAAAAAAAAAEAAAAAAAAAAgAAAAAAAAADAAAAAAAAAP3/////////
    \\/v///////////////////wAAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAMAAAAAAAAA/f/////////+////////////////////
    \\AAAAAAAAAAABAAAAAAAAAAIAAAAAAAAAAwAAAAAAAAD9//////////7///////////////////8AAAAAAAAAAAEAAAAAAAAA
    \\AgAAAAAAAAADAAAAAAAAAP3//////////v///////////////////wAAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAMAAAAAAAAA
    \\/f/////////+////////////////////AAAAAAAAAAABAAAAAAAAAAIAAAAAAAAAAwAAAAAAAAD9//////////7/////////
    \\//////////8AAAAAAAAAAAEAAAAAAAAAAgAAAAAAAAADAAAAAAAAAP3//////////v///////////////////wAAAAAAAAAA
    \\AQAAAAAAAAACAAAAAAAAAAMAAAAAAAAA/f/////////+////////////////////AAAAAAAAAAABAAAAAAAAAAIAAAAAAAAA
    \\AwAAAAAAAAD9//////////7///////////////////8AAAAAAAAAAAEAAAAAAAAAAgAAAAAAAAADAAAAAAAAAP3/////////
    \\/v///////////////////wAAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAMAAAAAAAAA/f////////////////////////////8A
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAwAAAAYAAAAJAAAADAAAAA8AAAA
    \\SAAAAFQAAABgAAAAbAAAAHgAAACFAAAAkgAAAJ8AAACsAAAAuQAAAMYAAADTAAAA4AAAAO0AAAD6AAAABwEAABQBAAAhAQAA
    \\LgEAADsBAABIAQAAVQEAAGIBAABvAQAAfAEAAIkBAACWAQAAowEAALABAAC9AQAAygEAANcBAADkAQAA8QEAAP4BAAALAgAA
    \\GAIAACUCAAAyAgAAPwIAAEwCAABZAgAAZgIAAHMCAACAAgAAjQIAAJoCAACnAgAAtAIAAMECAADOAgAA2wIAAOgCAAD1AgAA
    \\AgMAAA8DAAAcAwAAKQMAADYDAABDAwAAUAMAAF0DAABqAwAAdwMAAIQDAACRAwAAngMAAKsDAAC4AwAAxQMAANIDAADfAwAA
    \\7AMAAPkDAAAGBAAAEwQAACAEAAAtBAAAOgQAAEcEAABUBAAAYQQAAG4EAAB7BAAAiAQAAJUEAACiBAAArwQAALwEAADJBAAA
    \\1gQAAOMEAADwBAAA/QQAAAoFAAAYBQAAJgUAADQFAABCBQAAUAUAAF4FAABsBQAAegUAAIgFAACWBQAApAUAALIFAADABQAA
    \\zgUAANwFAADqBQAA+AUAAAYGAAAUBgAAIgYAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABpdGVtLTAtw6nkuK1pdGVt
    \\LTEtw6nkuK1pdGVtLTItw6nkuK1pdGVtLTMtw6nkuK1pdGVtLTQtw6nkuK1pdGVtLTUtw6nkuK1pdGVtLTYtw6nkuK1pdGVt
    \\LTctw6nkuK1pdGVtLTgtw6nkuK1pdGVtLTktw6nkuK1pdGVtLTEwLcOp5LitaXRlbS0xMS3DqeS4rWl0ZW0tMTItw6nkuK1p
    \\dGVtLTEzLcOp5LitaXRlbS0xNC3DqeS4rWl0ZW0tMTUtw6nkuK1pdGVtLTE2LcOp5LitaXRlbS0xNy3DqeS4rWl0ZW0tMTgt
    \\w6nkuK1pdGVtLTE5LcOp5LitaXRlbS0yMC3DqeS4rWl0ZW0tMjEtw6nkuK1pdGVtLTIyLcOp5LitaXRlbS0yMy3DqeS4rWl0
    \\ZW0tMjQtw6nkuK1pdGVtLTI1LcOp5LitaXRlbS0yNi3DqeS4rWl0ZW0tMjctw6nkuK1pdGVtLTI4LcOp5LitaXRlbS0yOS3D
    \\qeS4rWl0ZW0tMzAtw6nkuK1pdGVtLTMxLcOp5LitaXRlbS0zMi3DqeS4rWl0ZW0tMzMtw6nkuK1pdGVtLTM0LcOp5LitaXRl
    \\bS0zNS3DqeS4rWl0ZW0tMzYtw6nkuK1pdGVtLTM3LcOp5LitaXRlbS0zOC3DqeS4rWl0ZW0tMzktw6nkuK1pdGVtLTQwLcOp
    \\5LitaXRlbS00MS3DqeS4rWl0ZW0tNDItw6nkuK1pdGVtLTQzLcOp5LitaXRlbS00NC3DqeS4rWl0ZW0tNDUtw6nkuK1pdGVt
    \\LTQ2LcOp5LitaXRlbS00Ny3DqeS4rWl0ZW0tNDgtw6nkuK1pdGVtLTQ5LcOp5LitaXRlbS01MC3DqeS4rWl0ZW0tNTEtw6nk
    \\uK1pdGVtLTUyLcOp5LitaXRlbS01My3DqeS4rWl0ZW0tNTQtw6nkuK1pdGVtLTU1LcOp5LitaXRlbS01Ni3DqeS4rWl0ZW0t
    \\NTctw6nkuK1pdGVtLTU4LcOp5LitaXRlbS01OS3DqeS4rWl0ZW0tNjAtw6nkuK1pdGVtLTYxLcOp5LitaXRlbS02Mi3DqeS4
    \\rWl0ZW0tNjMtw6nkuK1pdGVtLTY0LcOp5LitaXRlbS02NS3DqeS4rWl0ZW0tNjYtw6nkuK1pdGVtLTY3LcOp5LitaXRlbS02
    \\OC3DqeS4rWl0ZW0tNjktw6nkuK1pdGVtLTcwLcOp5LitaXRlbS03MS3DqeS4rWl0ZW0tNzItw6nkuK1pdGVtLTczLcOp5Lit
    \\aXRlbS03NC3DqeS4rWl0ZW0tNzUtw6nkuK1pdGVtLTc2LcOp5LitaXRlbS03Ny3DqeS4rWl0ZW0tNzgtw6nkuK1pdGVtLTc5
    \\LcOp5LitaXRlbS04MC3DqeS4rWl0ZW0tODEtw6nkuK1pdGVtLTgyLcOp5LitaXRlbS04My3DqeS4rWl0ZW0tODQtw6nkuK1p
    \\dGVtLTg1LcOp5LitaXRlbS04Ni3DqeS4rWl0ZW0tODctw6nkuK1pdGVtLTg4LcOp5LitaXRlbS04OS3DqeS4rWl0ZW0tOTAt
    \\w6nkuK1pdGVtLTkxLcOp5LitaXRlbS05Mi3DqeS4rWl0ZW0tOTMtw6nkuK1pdGVtLTk0LcOp5LitaXRlbS05NS3DqeS4rWl0
    \\ZW0tOTYtw6nkuK1pdGVtLTk3LcOp5LitaXRlbS05OC3DqeS4rWl0ZW0tOTktw6nkuK1pdGVtLTEwMC3DqeS4rWl0ZW0tMTAx
    \\LcOp5LitaXRlbS0xMDItw6nkuK1pdGVtLTEwMy3DqeS4rWl0ZW0tMTA0LcOp5LitaXRlbS0xMDUtw6nkuK1pdGVtLTEwNi3D
    \\qeS4rWl0ZW0tMTA3LcOp5LitaXRlbS0xMDgtw6nkuK1pdGVtLTEwOS3DqeS4rWl0ZW0tMTEwLcOp5LitaXRlbS0xMTEtw6nk
    \\uK1pdGVtLTExMi3DqeS4rWl0ZW0tMTEzLcOp5LitaXRlbS0xMTQtw6nkuK1pdGVtLTExNS3DqeS4rWl0ZW0tMTE2LcOp5Lit
    \\aXRlbS0xMTctw6nkuK1pdGVtLTExOC3DqeS4rWl0ZW0tMTE5LcOp5LitAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
    \\////////////////////AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
    \\VVVVVVVV1T9VVVVVVVXlPwAAAAAAAPA/VVVVVVVV9T+rqqqqqqr6PwAAAAAAAABAq6qqqqqqAkBVVVVVVVUFQAAAAAAAAAhA
    \\q6qqqqqqCkBVVVVVVVUNQAAAAAAAABBAVVVVVVVVEUCrqqqqqqoSQAAAAAAAABRAVVVVVVVVFUCrqqqqqqoWQAAAAAAAABhA
    \\VVVVVVVVGUCrqqqqqqoaQAAAAAAAABxAVVVVVVVVHUCrqqqqqqoeQAAAAAAAACBAq6qqqqqqIEBVVVVVVVUhQAAAAAAAACJA
    \\q6qqqqqqIkBVVVVVVVUjQAAAAAAAACRAq6qqqqqqJEBVVVVVVVUlQAAAAAAAACZAq6qqqqqqJkBVVVVVVVUnQAAAAAAAAChA
    \\q6qqqqqqKEBVVVVVVVUpQAAAAAAAACpAq6qqqqqqKkBVVVVVVVUrQAAAAAAAACxAq6qqqqqqLEBVVVVVVVUtQAAAAAAAAC5A
    \\q6qqqqqqLkBVVVVVVVUvQAAAAAAAADBAVVVVVVVVMECrqqqqqqowQAAAAAAAADFAVVVVVVVVMUCrqqqqqqoxQAAAAAAAADJA
    \\VVVVVVVVMkCrqqqqqqoyQAAAAAAAADNAVVVVVVVVM0CrqqqqqqozQAAAAAAAADRAVVVVVVVVNECrqqqqqqo0QAAAAAAAADVA
    \\VVVVVVVVNUCrqqqqqqo1QAAAAAAAADZAVVVVVVVVNkCrqqqqqqo2QAAAAAAAADdAVVVVVVVVN0Crqqqqqqo3QAAAAAAAADhA
    \\VVVVVVVVOECrqqqqqqo4QAAAAAAAADlAVVVVVVVVOUCrqqqqqqo5QAAAAAAAADpAVVVVVVVVOkCrqqqqqqo6QAAAAAAAADtA
    \\VVVVVVVVO0Crqqqqqqo7QAAAAAAAADxAVVVVVVVVPECrqqqqqqo8QAAAAAAAAD1AVVVVVVVVPUCrqqqqqqo9QAAAAAAAAD5A
    \\VVVVVVVVPkCrqqqqqqo+QAAAAAAAAD9AVVVVVVVVP0Crqqqqqqo/QAAAAAAAAEBAq6qqqqoqQEBVVVVVVVVAQAAAAAAAgEBA
    \\q6qqqqqqQEBVVVVVVdVAQAAAAAAAAEFAq6qqqqoqQUBVVVVVVVVBQAAAAAAAgEFAq6qqqqqqQUBVVVVVVdVBQAAAAAAAAEJA
    \\q6qqqqoqQkBVVVVVVVVCQAAAAAAAgEJAq6qqqqqqQkBVVVVVVdVCQAAAAAAAAENAq6qqqqoqQ0BVVVVVVVVDQAAAAAAAgENA
    \\q6qqqqqqQ0BVVVVVVdVDQP////8AAAAAFAAAAAAAAAAMABQAEgAMAAgABAAMAAAAFAEAADABAAAQAAAAAAAEAAgACAAAAAQA
    \\CAAAAAQAAAAEAAAAxAAAAHgAAABMAAAAFAAAABAAFgAQAAAADwAEAAAACAAQAAAAGAAAABwAAAAAAAADGAAAAAAABgAIAAYA
    \\BgAAAAAAAgAAAAAABQAAAHNjb3JlAAAAoP///xQAAAAMAAAAAAAABQwAAAAAAAAAkP///wQAAABuYW1lAAAAAMj///8YAAAA
    \\IAAAAAAAAAIcAAAACAAMAAQACwAIAAAAQAAAAAAAAAEAAAAABQAAAGxhYmVsAAAAEAAUABAAAAAPAAQAAAAIABAAAAAYAAAA
    \\DAAAAAAAAAYQAAAAAAAAAAQABAAEAAAABAAAAGZsYWcAAAAAAQAAAIABAAAAAAAAQAEAAAAAAAAAEQAAAAAAAAAAAAAAAAAA
    \\UAEAAEFSUk9XMQ==
;

/// pyarrow pa.ipc.new_file: non-null flag/label/name/score, 5 rows
const all4_b64 =
    \\QVJST1cxAAD/////EAEAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAABAAAALAAAABkAAAA
    \\OAAAAAQAAABw////AAAAAxAAAAAcAAAABAAAAAAAAAAFAAAAc2NvcmUABgAIAAYABgAAAAAAAgCg////AAAABRAAAAAYAAAA
    \\BAAAAAAAAAAEAAAAbmFtZQAAAACQ////yP///wAAAAIQAAAAIAAAAAQAAAAAAAAABQAAAGxhYmVsAAAACAAMAAgABwAIAAAA
    \\AAAAAUAAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAYQAAAAHAAAAAQAAAAAAAAABAAAAGZsYWcAAAAABAAEAAQAAAAAAAAA
    \\/////ygBAAAUAAAAAAAAAAwAFgAGAAUACAAMAAwAAAAAAwQAGAAAAIAAAAAAAAAAAAAKABgADAAEAAgACgAAAKwAAAAQAAAA
    \\BQAAAAAAAAAAAAAACQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAACAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAA
    \\KAAAAAAAAAAwAAAAAAAAAAAAAAAAAAAAMAAAAAAAAAAYAAAAAAAAAEgAAAAAAAAACgAAAAAAAABYAAAAAAAAAAAAAAAAAAAA
    \\WAAAAAAAAAAoAAAAAAAAAAAAAAAEAAAABQAAAAAAAAAAAAAAAAAAAAUAAAAAAAAAAAAAAAAAAAAFAAAAAAAAAAAAAAAAAAAA
    \\BQAAAAAAAAAAAAAAAAAAAA0AAAAAAAAAAAAAAAAAAAD///////////////////9/AAAAAAAAAIAqAAAAAAAAAAAAAAABAAAA
    \\AQAAAAcAAAAJAAAACgAAAGFow6lsbG96engAAAAAAAAAAAAAAADgPwAAAAAAAACAAAAAAAAA8H8AAAAAAAD4f5x1AIg85Dd+
    \\/////wAAAAAQAAAADAAUAAYACAAMABAADAAAAAAABAA4AAAAKAAAAAQAAAABAAAAIAEAAAAAAAAwAQAAAAAAAIAAAAAAAAAA
    \\AAAAAAAAAAAIAAgAAAAEAAgAAAAEAAAABAAAALAAAABkAAAAOAAAAAQAAABw////AAAAAxAAAAAcAAAABAAAAAAAAAAFAAAA
    \\c2NvcmUABgAIAAYABgAAAAAAAgCg////AAAABRAAAAAYAAAABAAAAAAAAAAEAAAAbmFtZQAAAACQ////yP///wAAAAIQAAAA
    \\IAAAAAQAAAAAAAAABQAAAGxhYmVsAAAACAAMAAgABwAIAAAAAAAAAUAAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAYQAAAA
    \\HAAAAAQAAAAAAAAABAAAAGZsYWcAAAAABAAEAAQAAAA4AQAAQVJST1cx
;

/// pyarrow: nullable b/i/s/f in three batches of 2, 0 and 3 rows, with nulls
const multi_b64 =
    \\QVJST1cxAAD/////AAEAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAABAAAAKQAAABcAAAA
    \\NAAAAAQAAAB8////AAABAxAAAAAYAAAABAAAAAAAAAABAAAAZgAGAAgABgAGAAAAAAACAKj///8AAAEFEAAAABQAAAAEAAAA
    \\AAAAAAEAAABzAAAAmP///8z///8AAAECEAAAABwAAAAEAAAAAAAAAAEAAABpAAAACAAMAAgABwAIAAAAAAAAAUAAAAAQABQA
    \\CAAGAAcADAAAABAAEAAAAAAAAQYQAAAAGAAAAAQAAAAAAAAAAQAAAGIAAAAEAAQABAAAAAAAAAD/////KAEAABQAAAAAAAAA
    \\DAAWAAYABQAIAAwADAAAAAADBAAYAAAAYAAAAAAAAAAAAAoAGAAMAAQACAAKAAAArAAAABAAAAACAAAAAAAAAAAAAAAJAAAA
    \\AAAAAAAAAAABAAAAAAAAAAgAAAAAAAAAAQAAAAAAAAAQAAAAAAAAAAEAAAAAAAAAGAAAAAAAAAAQAAAAAAAAACgAAAAAAAAA
    \\AQAAAAAAAAAwAAAAAAAAAAwAAAAAAAAAQAAAAAAAAAABAAAAAAAAAEgAAAAAAAAAAQAAAAAAAABQAAAAAAAAABAAAAAAAAAA
    \\AAAAAAQAAAACAAAAAAAAAAEAAAAAAAAAAgAAAAAAAAABAAAAAAAAAAIAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAEAAAAAAAAA
    \\AQAAAAAAAAABAAAAAAAAAAEAAAAAAAAAAQAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAAAAAAEAAAABAAAAAAAAAHgAAAAAAAAA
    \\AgAAAAAAAAAAAAAAAAAAAAAAAAAAAARA/////yABAAAUAAAAAAAAAAwAGgAGAAUACAAMAAwAAAAAAwQAHAAAAAgAAAAAAAAA
    \\AAAAAAAACgAMAAAABAAIAAoAAACgAAAABAAAAAkAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAA
    \\CAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAP////8oAQAAFAAAAAAAAAAMABYABgAFAAgADAAMAAAA
    \\AAMEABgAAABYAAAAAAAAAAAACgAYAAwABAAIAAoAAACsAAAAEAAAAAMAAAAAAAAAAAAAAAkAAAAAAAAAAAAAAAEAAAAAAAAA
    \\CAAAAAAAAAABAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAABgAAAAAAAAAKAAAAAAAAAAAAAAAAAAAACgAAAAAAAAA
    \\EAAAAAAAAAA4AAAAAAAAAAYAAAAAAAAAQAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAGAAAAAAAAAAAAAAABAAAAAMAAAAAAAAA
    \\AQAAAAAAAAADAAAAAAAAAAAAAAAAAAAAAwAAAAAAAAAAAAAAAAAAAAMAAAAAAAAAAAAAAAAAAAADAAAAAAAAAAIAAAAAAAAA
    \\BwAAAAAAAAAIAAAAAAAAAAkAAAAAAAAAAAAAAAEAAAADAAAABgAAAHBxcXJycgAAAAAAAAAACEAAAAAAAAAQQAAAAAAAABRA
    \\/////wAAAAAQAAAADAAUAAYACAAMABAADAAAAAAABABoAAAAWAAAAAQAAAADAAAAEAEAAAAAAAAwAQAAAAAAAGAAAAAAAAAA
    \\oAIAAAAAAAAoAQAAAAAAAAgAAAAAAAAA0AMAAAAAAAAwAQAAAAAAAFgAAAAAAAAAAAAAAAAAAAAIAAgAAAAEAAgAAAAEAAAA
    \\BAAAAKQAAABcAAAANAAAAAQAAAB8////AAABAxAAAAAYAAAABAAAAAAAAAABAAAAZgAGAAgABgAGAAAAAAACAKj///8AAAEF
    \\EAAAABQAAAAEAAAAAAAAAAEAAABzAAAAmP///8z///8AAAECEAAAABwAAAAEAAAAAAAAAAEAAABpAAAACAAMAAgABwAIAAAA
    \\AAAAAUAAAAAQABQACAAGAAcADAAAABAAEAAAAAAAAQYQAAAAGAAAAAQAAAAAAAAAAQAAAGIAAAAEAAQABAAAAFgBAABBUlJP
    \\VzE=
;

/// pyarrow: schema of all4 and no record batch
const nobatch_b64 =
    \\QVJST1cxAAD/////EAEAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAABAAAALAAAABkAAAA
    \\OAAAAAQAAABw////AAAAAxAAAAAcAAAABAAAAAAAAAAFAAAAc2NvcmUABgAIAAYABgAAAAAAAgCg////AAAABRAAAAAYAAAA
    \\BAAAAAAAAAAEAAAAbmFtZQAAAACQ////yP///wAAAAIQAAAAIAAAAAQAAAAAAAAABQAAAGxhYmVsAAAACAAMAAgABwAIAAAA
    \\AAAAAUAAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAYQAAAAHAAAAAQAAAAAAAAABAAAAGZsYWcAAAAABAAEAAQAAAAAAAAA
    \\/////wAAAAAQAAAADAAUAAYACAAMABAADAAAAAAABAAcAAAADAAAAAQAAAAAAAAAAAAAAAgACAAAAAQACAAAAAQAAAAEAAAA
    \\sAAAAGQAAAA4AAAABAAAAHD///8AAAADEAAAABwAAAAEAAAAAAAAAAUAAABzY29yZQAGAAgABgAGAAAAAAACAKD///8AAAAF
    \\EAAAABgAAAAEAAAAAAAAAAQAAABuYW1lAAAAAJD////I////AAAAAhAAAAAgAAAABAAAAAAAAAAFAAAAbGFiZWwAAAAIAAwA
    \\CAAHAAgAAAAAAAABQAAAABAAFAAIAAAABwAMAAAAEAAQAAAAAAAABhAAAAAcAAAABAAAAAAAAAAEAAAAZmxhZwAAAAAEAAQA
    \\BAAAABwBAABBUlJPVzE=
;

/// pyarrow: one utf8 column, one 0-row batch
const zerorow_b64 =
    \\QVJST1cxAAD/////cAAAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAAAQAAABQAAAAQABQA
    \\CAAGAAcADAAAABAAEAAAAAAAAQUQAAAAGAAAAAQAAAAAAAAAAQAAAHMAAAAEAAQABAAAAAAAAAD/////kAAAABQAAAAAAAAA
    \\DAAaAAYABQAIAAwADAAAAAADBAAcAAAACAAAAAAAAAAAAAAAAAAKAAwAAAAEAAgACgAAAEAAAAAEAAAAAwAAAAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
    \\/////wAAAAAQAAAADAAUAAYACAAMABAADAAAAAAABAA4AAAAKAAAAAQAAAABAAAAgAAAAAAAAACYAAAAAAAAAAgAAAAAAAAA
    \\AAAAAAAAAAAIAAgAAAAEAAgAAAAEAAAAAQAAABQAAAAQABQACAAGAAcADAAAABAAEAAAAAAAAQUQAAAAGAAAAAQAAAAAAAAA
    \\AQAAAHMAAAAEAAQABAAAAJgAAABBUlJPVzE=
;

/// pyarrow: rows 5..13 of a 20-row table (a sliced batch)
const sliced_b64 =
    \\QVJST1cxAAD/////EAEAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAABAAAALAAAABkAAAA
    \\OAAAAAQAAABw////AAAAAxAAAAAcAAAABAAAAAAAAAAFAAAAc2NvcmUABgAIAAYABgAAAAAAAgCg////AAAABRAAAAAYAAAA
    \\BAAAAAAAAAAEAAAAbmFtZQAAAACQ////yP///wAAAAIQAAAAIAAAAAQAAAAAAAAABQAAAGxhYmVsAAAACAAMAAgABwAIAAAA
    \\AAAAAUAAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAYQAAAAHAAAAAQAAAAAAAAABAAAAGZsYWcAAAAABAAEAAQAAAAAAAAA
    \\/////ygBAAAUAAAAAAAAAAwAFgAGAAUACAAMAAwAAAAAAwQAGAAAAOgAAAAAAAAAAAAKABgADAAEAAgACgAAAKwAAAAQAAAA
    \\CQAAAAAAAAAAAAAACQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIAAAAAAAAACAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAA
    \\SAAAAAAAAABQAAAAAAAAAAAAAAAAAAAAUAAAAAAAAAAoAAAAAAAAAHgAAAAAAAAAKAAAAAAAAACgAAAAAAAAAAAAAAAAAAAA
    \\oAAAAAAAAABIAAAAAAAAAAAAAAAEAAAACQAAAAAAAAAAAAAAAAAAAAkAAAAAAAAAAAAAAAAAAAAJAAAAAAAAAAAAAAAAAAAA
    \\CQAAAAAAAAAAAAAAAAAAAJIAAAAAAAAABQAAAAAAAAAGAAAAAAAAAAcAAAAAAAAACAAAAAAAAAAJAAAAAAAAAAoAAAAAAAAA
    \\CwAAAAAAAAAMAAAAAAAAAA0AAAAAAAAAAAAAAAIAAAAEAAAABgAAAAgAAAAKAAAADQAAABAAAAATAAAAFgAAAG41bjZuN244
    \\bjluMTBuMTFuMTJuMTNuMTRuMTVuMTZuMTduMThuMTkAAAAAAAD0PwAAAAAAAPg/AAAAAAAA/D8AAAAAAAAAQAAAAAAAAAJA
    \\AAAAAAAABEAAAAAAAAAGQAAAAAAAAAhAAAAAAAAACkD/////AAAAABAAAAAMABQABgAIAAwAEAAMAAAAAAAEADgAAAAoAAAA
    \\BAAAAAEAAAAgAQAAAAAAADABAAAAAAAA6AAAAAAAAAAAAAAAAAAAAAgACAAAAAQACAAAAAQAAAAEAAAAsAAAAGQAAAA4AAAA
    \\BAAAAHD///8AAAADEAAAABwAAAAEAAAAAAAAAAUAAABzY29yZQAGAAgABgAGAAAAAAACAKD///8AAAAFEAAAABgAAAAEAAAA
    \\AAAAAAQAAABuYW1lAAAAAJD////I////AAAAAhAAAAAgAAAABAAAAAAAAAAFAAAAbGFiZWwAAAAIAAwACAAHAAgAAAAAAAAB
    \\QAAAABAAFAAIAAAABwAMAAAAEAAQAAAAAAAABhAAAAAcAAAABAAAAAAAAAAEAAAAZmxhZwAAAAAEAAQABAAAADgBAABBUlJP
    \\VzE=
;

/// pyarrow: s large_utf8 ['ab','c'], i int64 [1,2]
const large_b64 =
    \\QVJST1cxAAD/////qAAAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAAAgAAAEwAAAAEAAAA
    \\zP///wAAAQIQAAAAHAAAAAQAAAAAAAAAAQAAAGkAAAAIAAwACAAHAAgAAAAAAAABQAAAABAAFAAIAAYABwAMAAAAEAAQAAAA
    \\AAABFBAAAAAYAAAABAAAAAAAAAABAAAAcwAAAAQABAAEAAAAAAAAAP/////IAAAAFAAAAAAAAAAMABYABgAFAAgADAAMAAAA
    \\AAMEABgAAAAwAAAAAAAAAAAACgAYAAwABAAIAAoAAABsAAAAEAAAAAIAAAAAAAAAAAAAAAUAAAAAAAAAAAAAAAAAAAAAAAAA
    \\AAAAAAAAAAAYAAAAAAAAABgAAAAAAAAAAwAAAAAAAAAgAAAAAAAAAAAAAAAAAAAAIAAAAAAAAAAQAAAAAAAAAAAAAAACAAAA
    \\AgAAAAAAAAAAAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIAAAAAAAAAAwAAAAAAAABhYmMAAAAAAAEAAAAAAAAA
    \\AgAAAAAAAAD/////AAAAABAAAAAMABQABgAIAAwAEAAMAAAAAAAEADgAAAAoAAAABAAAAAEAAAC4AAAAAAAAANAAAAAAAAAA
    \\MAAAAAAAAAAAAAAAAAAAAAgACAAAAAQACAAAAAQAAAACAAAATAAAAAQAAADM////AAABAhAAAAAcAAAABAAAAAAAAAABAAAA
    \\aQAAAAgADAAIAAcACAAAAAAAAAFAAAAAEAAUAAgABgAHAAwAAAAQABAAAAAAAAEUEAAAABgAAAAEAAAAAAAAAAEAAABzAAAA
    \\BAAEAAQAAADQAAAAQVJST1cx
;

/// polars write_ipc (default compat level): s string_view, i int64 [1,2]
const polars_b64 =
    \\QVJST1cxAAAEAAAA8v///xQAAAAEAAEAAAAKAAsACAAKAAQA+P///wwAAAAIAAgAAAAEAAIAAAA8AAAABAAAALj///8oAAAA
    \\EAAAAAgAAAABAgAAAAAAAPT///9AAAAAAQAAAAgACQAEAAgAAQAAAGkAAADs////LAAAACAAAAAYAAAAARgAABAAEgAEABAA
    \\EQAIAAAADAAAAAAA/P///wQABAABAAAAcwAAAAAAAAD/////2AAAAAQAAADs////wAAAAAAAAAAUAAAABAADAAwAEwAQABIA
    \\DAAEAOb///8CAAAAAAAAAIQAAAAoAAAAFAAAAAAADgAYAAQADAAQAAAAFAABAAAAAQAAAAAAAAAAAAAABQAAAAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAACAAAAAAAAAAQAAAAAAAAAAhAAAAAAAAAIAAAAAAAAAAAAAAAAAAAACAAAAAAAAAABAAAAAAAAAA
    \\AAAAAAIAAAACAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAAAAAAAAAAAAIAAABhYgAAAAAAAAAAAAAhAAAAYSBzdAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABhIHN0cmluZyBsb25nZXIgdGhhbiB0d2VsdmUgYnl0ZXMAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAAP////8AAAAABAAAAOz///9AAAAAOAAAABQAAAAEAAAADAASABAABAAIAAwAAQAAALAAAAAAAAAA
    \\4AAAAAAAAADAAAAAAAAAAAAAAAAAAAAA+P///wwAAAAIAAgAAAAEAAIAAAA8AAAABAAAALj///8oAAAAEAAAAAgAAAABAgAA
    \\AAAAAPT///9AAAAAAQAAAAgACQAEAAgAAQAAAGkAAADs////LAAAACAAAAAYAAAAARgAABAAEgAEABAAEQAIAAAADAAAAAAA
    \\/P///wQABAABAAAAcwDOAAAAQVJST1cx
;

/// pyarrow: list, struct, string_view, null, int32 columns, then i int64 [10,20,30], s utf8 ['u','vv','www']
const nested_b64 =
    \\QVJST1cxAAD/////AAIAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAABwAAAFwBAADcAAAA
    \\tAAAAIwAAABcAAAALAAAAAQAAACU/v//AAABBRAAAAAUAAAABAAAAAAAAAABAAAAcwAAALz+//+4/v//AAABAhAAAAAUAAAA
    \\BAAAAAAAAAABAAAAaQAAAKT+//8AAAABQAAAAOT+//8AAAECEAAAABQAAAAEAAAAAAAAAAMAAABpMzIA0P7//wAAAAEgAAAA
    \\EP///wAAAQEQAAAAFAAAAAQAAAAAAAAAAQAAAG4AAAA4////NP///wAAARgQAAAAFAAAAAQAAAAAAAAAAQAAAHYAAABc////
    \\WP///wAAAQ0YAAAAHAAAAAQAAAACAAAAOAAAABAAAAACAAAAc3QAAIj///+E////AAABBRAAAAAUAAAABAAAAAAAAAABAAAA
    \\eQAAAKz///+o////AAABAhAAAAAUAAAABAAAAAAAAAABAAAAeAAAAJT///8AAAABQAAAANT///8AAAEMFAAAABwAAAAEAAAA
    \\AQAAACQAAAABAAAAbAAAAAQABAAEAAAAEAAUAAgABgAHAAwAAAAQABAAAAAAAAECEAAAACAAAAAEAAAAAAAAAAQAAABpdGVt
    \\AAAAAAgADAAIAAcACAAAAAAAAAFAAAAA/////1ACAAAUAAAAAAAAAAwAFgAGAAUACAAMAAwAAAAAAwQAHAAAAPAAAAAAAAAA
    \\AAAOABwAEAAEAAgAAAAMAA4AAABwAQAAJAAAABAAAAADAAAAAAAAAAAAAAABAAAAAQAAAAAAAAAAAAAAFAAAAAAAAAAAAAAA
    \\AQAAAAAAAAAIAAAAAAAAABAAAAAAAAAAGAAAAAAAAAAAAAAAAAAAABgAAAAAAAAAGAAAAAAAAAAwAAAAAAAAAAEAAAAAAAAA
    \\OAAAAAAAAAAAAAAAAAAAADgAAAAAAAAAGAAAAAAAAABQAAAAAAAAAAAAAAAAAAAAUAAAAAAAAAAQAAAAAAAAAGAAAAAAAAAA
    \\AgAAAAAAAABoAAAAAAAAAAAAAAAAAAAAaAAAAAAAAAAwAAAAAAAAAJgAAAAAAAAAGAAAAAAAAACwAAAAAAAAAAAAAAAAAAAA
    \\sAAAAAAAAAAMAAAAAAAAAMAAAAAAAAAAAAAAAAAAAADAAAAAAAAAABgAAAAAAAAA2AAAAAAAAAAAAAAAAAAAANgAAAAAAAAA
    \\EAAAAAAAAADoAAAAAAAAAAYAAAAAAAAAAAAAAAoAAAADAAAAAAAAAAEAAAAAAAAAAwAAAAAAAAAAAAAAAAAAAAMAAAAAAAAA
    \\AQAAAAAAAAADAAAAAAAAAAAAAAAAAAAAAwAAAAAAAAAAAAAAAAAAAAMAAAAAAAAAAAAAAAAAAAADAAAAAAAAAAMAAAAAAAAA
    \\AwAAAAAAAAAAAAAAAAAAAAMAAAAAAAAAAAAAAAAAAAADAAAAAAAAAAAAAAAAAAAABQAAAAAAAAAAAAAAAgAAAAIAAAADAAAA
    \\AQAAAAAAAAACAAAAAAAAAAMAAAAAAAAAAwAAAAAAAAABAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAIAAAACAAAA
    \\YWIAAAAAAAABAAAAeAAAAAAAAAAAAAAAGAAAAGxvbmcAAAAAAAAAAAEAAAB6AAAAAAAAAAAAAABsb25nIHN0cmluZyB2YWx1
    \\ZSBoZXJlISEBAAAAAgAAAAMAAAAAAAAACgAAAAAAAAAUAAAAAAAAAB4AAAAAAAAAAAAAAAEAAAADAAAABgAAAHV2dnd3dwAA
    \\/////wAAAAAQAAAADAAUAAYACAAMABAADAAAAAAABAA0AAAAJAAAAAQAAAABAAAAEAIAAAAAAABYAgAAAAAAAPAAAAAAAAAA
    \\AAAAAAgACAAAAAQACAAAAAQAAAAHAAAAXAEAANwAAAC0AAAAjAAAAFwAAAAsAAAABAAAAJT+//8AAAEFEAAAABQAAAAEAAAA
    \\AAAAAAEAAABzAAAAvP7//7j+//8AAAECEAAAABQAAAAEAAAAAAAAAAEAAABpAAAApP7//wAAAAFAAAAA5P7//wAAAQIQAAAA
    \\FAAAAAQAAAAAAAAAAwAAAGkzMgDQ/v//AAAAASAAAAAQ////AAABARAAAAAUAAAABAAAAAAAAAABAAAAbgAAADj///80////
    \\AAABGBAAAAAUAAAABAAAAAAAAAABAAAAdgAAAFz///9Y////AAABDRgAAAAcAAAABAAAAAIAAAA4AAAAEAAAAAIAAABzdAAA
    \\iP///4T///8AAAEFEAAAABQAAAAEAAAAAAAAAAEAAAB5AAAArP///6j///8AAAECEAAAABQAAAAEAAAAAAAAAAEAAAB4AAAA
    \\lP///wAAAAFAAAAA1P///wAAAQwUAAAAHAAAAAQAAAABAAAAJAAAAAEAAABsAAAABAAEAAQAAAAQABQACAAGAAcADAAAABAA
    \\EAAAAAAAAQIQAAAAIAAAAAQAAAAAAAAABAAAAGl0ZW0AAAAACAAMAAgABwAIAAAAAAAAAUAAAAAoAgAAQVJST1cx
;

/// polars write_ipc(compression='lz4', compat_level=oldest)
const polars_lz4_b64 =
    \\QVJST1cxAAAEAAAA8v///xQAAAAEAAEAAAAKAAsACAAKAAQA+P///wwAAAAIAAgAAAAEAAIAAAA8AAAABAAAALj///8oAAAA
    \\EAAAAAgAAAABAgAAAAAAAPT///9AAAAAAQAAAAgACQAEAAgAAQAAAGkAAADs////LAAAACAAAAAYAAAAARQAABAAEgAEABAA
    \\EQAIAAAADAAAAAAA/P///wQABAABAAAAcwAAAAAAAAD/////0AAAAAQAAADs////wAAAAAAAAAAUAAAABAADAAwAEwAQABIA
    \\DAAEAOT///8CAAAAAAAAAHwAAAAgAAAAFAAAAAAAAAAMABgABAAMABAAFAD8////BAAEAAUAAAAAAAAAAAAAAAAAAAAAAAAA
    \\AAAAAAAAAAAwAAAAAAAAAEAAAAAAAAAAIwAAAAAAAACAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAAtAAAAAAAAAAAAAAACAAAA
    \\AgAAAAAAAAAAAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAAYAAAAAAAAAAQiTRhUQK4RAAAAEwABABMCCACABAAAAAAAAAByMzsb
    \\AAAAAAGxSBAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAEIk0YVECuBAAAgGFiY2QFN2SjAAAAAAU3ZKMAAAAAAAAAAAAAAAAA
    \\AAAAAAAAAAAAAAAAAAAAABAAAAAAAAAABCJNGFRArg4AAAAiAQABAIACAAAAAAAAAFSWpwEAAAAA51OXagAAAAAAAAAAAAAA
    \\AAAAAAAAAAD/////AAAAAAQAAADs////QAAAADgAAAAUAAAABAAAAAwAEgAQAAQACAAMAAEAAACwAAAAAAAAANgAAAAAAAAA
    \\wAAAAAAAAAAAAAAAAAAAAPj///8MAAAACAAIAAAABAACAAAAPAAAAAQAAAC4////KAAAABAAAAAIAAAAAQIAAAAAAAD0////
    \\QAAAAAEAAAAIAAkABAAIAAEAAABpAAAA7P///ywAAAAgAAAAGAAAAAEUAAAQABIABAAQABEACAAAAAwAAAAAAPz///8EAAQA
    \\AQAAAHMAzgAAAEFSUk9XMQ==
;

/// pyarrow: all4 with IpcWriteOptions(compression='zstd')
const zstd_b64 =
    \\QVJST1cxAAD/////EAEAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAABAAAALAAAABkAAAA
    \\OAAAAAQAAABw////AAAAAxAAAAAcAAAABAAAAAAAAAAFAAAAc2NvcmUABgAIAAYABgAAAAAAAgCg////AAAABRAAAAAYAAAA
    \\BAAAAAAAAAAEAAAAbmFtZQAAAACQ////yP///wAAAAIQAAAAIAAAAAQAAAAAAAAABQAAAGxhYmVsAAAACAAMAAgABwAIAAAA
    \\AAAAAUAAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAYQAAAAHAAAAAQAAAAAAAAABAAAAGZsYWcAAAAABAAEAAQAAAAAAAAA
    \\/////0ABAAAUAAAAAAAAAAwAGAAGAAUACAAMAAwAAAAAAwQAHAAAAMgAAAAAAAAAAAAAAAwAHgAQAAQACAAMAAwAAADAAAAA
    \\JAAAABgAAAAFAAAAAAAAAAAAAAAAAAYACAAHAAYAAAAAAAABCQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABIAAAAAAAAA
    \\GAAAAAAAAAAAAAAAAAAAABgAAAAAAAAAKAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAAApAAAAAAAAAHAAAAAAAAAA
    \\GwAAAAAAAACQAAAAAAAAAAAAAAAAAAAAkAAAAAAAAAAxAAAAAAAAAAAAAAAEAAAABQAAAAAAAAAAAAAAAAAAAAUAAAAAAAAA
    \\AAAAAAAAAAAFAAAAAAAAAAAAAAAAAAAABQAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAKLUv/SABCQAADQAAAAAAACgAAAAAAAAA
    \\KLUv/SAovQAAcAAA/38AgCoAAAAAAAAAAxAAA0qGtQEYAAAAAAAAACi1L/0gGMEAAAAAAAABAAAAAQAAAAcAAAAJAAAACgAA
    \\AAAAAAAAAAAKAAAAAAAAACi1L/0gClEAAGFow6lsbG96engAAAAAACgAAAAAAAAAKLUv/SAoBQEAwAAAAAAAAOA/AIAA8H8A
    \\+H+cdQCIPOQ3fgMQADIuHo4AAAAAAAAA/////wAAAAAQAAAADAAUAAYACAAMABAADAAAAAAABAA4AAAAKAAAAAQAAAABAAAA
    \\IAEAAAAAAABIAQAAAAAAAMgAAAAAAAAAAAAAAAAAAAAIAAgAAAAEAAgAAAAEAAAABAAAALAAAABkAAAAOAAAAAQAAABw////
    \\AAAAAxAAAAAcAAAABAAAAAAAAAAFAAAAc2NvcmUABgAIAAYABgAAAAAAAgCg////AAAABRAAAAAYAAAABAAAAAAAAAAEAAAA
    \\bmFtZQAAAACQ////yP///wAAAAIQAAAAIAAAAAQAAAAAAAAABQAAAGxhYmVsAAAACAAMAAgABwAIAAAAAAAAAUAAAAAQABQA
    \\CAAAAAcADAAAABAAEAAAAAAAAAYQAAAAHAAAAAQAAAAAAAAABAAAAGZsYWcAAAAABAAEAAQAAAA4AQAAQVJST1cx
;

/// pyarrow pa.ipc.new_stream of all4 (stream format, not file)
const stream_b64 =
    \\/////xABAAAQAAAAAAAKAAwABgAFAAgACgAAAAABBAAMAAAACAAIAAAABAAIAAAABAAAAAQAAACwAAAAZAAAADgAAAAEAAAA
    \\cP///wAAAAMQAAAAHAAAAAQAAAAAAAAABQAAAHNjb3JlAAYACAAGAAYAAAAAAAIAoP///wAAAAUQAAAAGAAAAAQAAAAAAAAA
    \\BAAAAG5hbWUAAAAAkP///8j///8AAAACEAAAACAAAAAEAAAAAAAAAAUAAABsYWJlbAAAAAgADAAIAAcACAAAAAAAAAFAAAAA
    \\EAAUAAgAAAAHAAwAAAAQABAAAAAAAAAGEAAAABwAAAAEAAAAAAAAAAQAAABmbGFnAAAAAAQABAAEAAAAAAAAAP////8oAQAA
    \\FAAAAAAAAAAMABYABgAFAAgADAAMAAAAAAMEABgAAACAAAAAAAAAAAAACgAYAAwABAAIAAoAAACsAAAAEAAAAAUAAAAAAAAA
    \\AAAAAAkAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAgAAAAAAAAAAAAAAAAAAAAIAAAAAAAAACgAAAAAAAAA
    \\MAAAAAAAAAAAAAAAAAAAADAAAAAAAAAAGAAAAAAAAABIAAAAAAAAAAoAAAAAAAAAWAAAAAAAAAAAAAAAAAAAAFgAAAAAAAAA
    \\KAAAAAAAAAAAAAAABAAAAAUAAAAAAAAAAAAAAAAAAAAFAAAAAAAAAAAAAAAAAAAABQAAAAAAAAAAAAAAAAAAAAUAAAAAAAAA
    \\AAAAAAAAAAANAAAAAAAAAAAAAAAAAAAA////////////////////fwAAAAAAAACAKgAAAAAAAAAAAAAAAQAAAAEAAAAHAAAA
    \\CQAAAAoAAABhaMOpbGxvenp4AAAAAAAAAAAAAAAA4D8AAAAAAAAAgAAAAAAAAPB/AAAAAAAA+H+cdQCIPOQ3fv////8AAAAA
;

/// pyarrow: dictionary-encoded utf8 column
const dict_b64 =
    \\QVJST1cxAAD/////kAAAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAQAAAC8////BAAAAAEAAAAUAAAAEAAYAAgABgAHAAwA
    \\EAAUABAAAAAAAAEFFAAAAEAAAAAcAAAABAAAAAAAAAABAAAAZAAAAAgACAAAAAQACAAAAAwAAAAIAAwACAAHAAgAAAAAAAAB
    \\IAAAAAQABAAEAAAAAAAAAP////+oAAAAFAAAAAAAAAAMABQABgAFAAgADAAMAAAAAAIEABQAAAAYAAAAAAAAAAgACgAAAAQA
    \\CAAAABAAAAAAAAoAGAAMAAQACAAKAAAATAAAABAAAAACAAAAAAAAAAAAAAADAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
    \\DAAAAAAAAAAQAAAAAAAAAAIAAAAAAAAAAAAAAAEAAAACAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAACAAAAAAAAAGFiAAAAAAAA
    \\/////4gAAAAUAAAAAAAAAAwAFgAGAAUACAAMAAwAAAAAAwQAGAAAABAAAAAAAAAAAAAKABgADAAEAAgACgAAADwAAAAQAAAA
    \\AwAAAAAAAAAAAAAAAgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAwAAAAAAAAAAAAAAAEAAAADAAAAAAAAAAAAAAAAAAAA
    \\AAAAAAEAAAAAAAAAAAAAAP////8AAAAAEAAAAAwAFAAGAAgADAAQAAwAAAAAAAQASAAAACgAAAAEAAAAAQAAAGgBAAAAAAAA
    \\kAAAAAAAAAAQAAAAAAAAAAAAAAABAAAAoAAAAAAAAACwAAAAAAAAABgAAAAAAAAAvP///wQAAAABAAAAFAAAABAAGAAIAAYA
    \\BwAMABAAFAAQAAAAAAABBRQAAABAAAAAHAAAAAQAAAAAAAAAAQAAAGQAAAAIAAgAAAAEAAgAAAAMAAAACAAMAAgABwAIAAAA
    \\AAAAASAAAAAEAAQABAAAANAAAABBUlJPVzE=
;
