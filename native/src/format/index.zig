//! `index.bin`: one 24-byte little-endian row `(shard_id, offset, byte_len)` per sample,
//! in sample order. Offset and length span the whole record (length prefix, JSON and
//! stored payload). The reader checks the shape at open (row size, row count, shard ids)
//! and record bounds only when a record is read, like the reference.

const std = @import("std");

pub const row_bytes = 24;

pub const Row = struct {
    shard_id: u64,
    offset: u64,
    byte_len: u64,

    /// Whether the record lies within a shard of `shard_len` bytes (a corrupt row may
    /// point anywhere; no overflow whatever its fields).
    pub fn within(r: Row, shard_len: u64) bool {
        return r.offset <= shard_len and r.byte_len <= shard_len - r.offset;
    }
};

test "Row.within: bounds without overflow" {
    const Case = struct { offset: u64, len: u64, want: bool };
    const max = std.math.maxInt(u64);
    for ([_]Case{
        .{ .offset = 0, .len = 10, .want = true },
        .{ .offset = 4, .len = 6, .want = true },
        .{ .offset = 4, .len = 7, .want = false },
        .{ .offset = 10, .len = 0, .want = true },
        .{ .offset = 11, .len = 0, .want = false },
        .{ .offset = max, .len = 1, .want = false },
        .{ .offset = 1, .len = max, .want = false },
    }) |case| {
        const r: Row = .{ .shard_id = 0, .offset = case.offset, .byte_len = case.len };
        try std.testing.expectEqual(case.want, r.within(10));
    }
}

/// Row `i` of an index image (bytes.len is a multiple of row_bytes; i < row count).
pub fn get(bytes: []const u8, i: u64) Row {
    const at: usize = @intCast(i * row_bytes);
    const row = bytes[at..][0..row_bytes];
    return .{
        .shard_id = std.mem.readInt(u64, row[0..8], .little),
        .offset = std.mem.readInt(u64, row[8..16], .little),
        .byte_len = std.mem.readInt(u64, row[16..24], .little),
    };
}

/// Encodes one row.
pub fn encode(row: Row) [row_bytes]u8 {
    var out: [row_bytes]u8 = undefined;
    std.mem.writeInt(u64, out[0..8], row.shard_id, .little);
    std.mem.writeInt(u64, out[8..16], row.offset, .little);
    std.mem.writeInt(u64, out[16..24], row.byte_len, .little);
    return out;
}

test "index rows round trip and match the reference layout" {
    // Reference example: (0,0x3a,0x3b) is the second row of a 5-sample cache.
    const bytes = encode(.{ .shard_id = 0, .offset = 0x3a, .byte_len = 0x3b });
    try std.testing.expectEqualSlices(u8, &[_]u8{ 0, 0, 0, 0, 0, 0, 0, 0, 0x3a, 0, 0, 0, 0, 0, 0, 0, 0x3b, 0, 0, 0, 0, 0, 0, 0 }, &bytes);
    const row = get(&bytes, 0);
    try std.testing.expectEqual(@as(u64, 0x3b), row.byte_len);
}
