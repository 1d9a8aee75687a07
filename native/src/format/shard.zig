//! Shard records: `json_len: u64 LE`, the sample's metadata as compact JSON, then the
//! stored payload (raw, or for lz4 a u32 LE raw length followed by one LZ4 block).
//! Shards are plain concatenations of records; index.bin says where each one starts.

const std = @import("std");
const status = @import("../base/status.zig");

pub const header_bytes = 8;

/// The parts of one record image.
pub const Record = struct {
    json: []const u8,
    stored_payload: []const u8,
    /// Offset of the stored payload within the record image.
    payload_offset: usize,
};

/// Where the stored payload of a record image starts (after its header and JSON), or
/// null when its length prefix does not fit the record: `split` without the error, for
/// callers that split many records and stop at the first bad one.
pub fn payloadOffset(record: []const u8) ?usize {
    if (record.len < header_bytes) return null;
    const json_len = std.mem.readInt(u64, record[0..header_bytes], .little);
    if (json_len > record.len - header_bytes) return null;
    return header_bytes + @as(usize, @intCast(json_len));
}

/// Splits a record image. A length prefix that does not fit the record is the
/// reference's "invalid binary record".
pub fn split(record: []const u8) status.Error!Record {
    const json_end = payloadOffset(record) orelse return status.fail(error.InvalidCache, "invalid binary record", .{});
    return .{
        .json = record[header_bytes..json_end],
        .stored_payload = record[json_end..],
        .payload_offset = json_end,
    };
}

test "split a reference record" {
    const bytes = "\x2f\x00\x00\x00\x00\x00\x00\x00" ++ "{\"flag\":true,\"label\":0,\"name\":\"s0\",\"score\":0.0}" ++ "\x00\x00\x00";
    const r = try split(bytes);
    try std.testing.expectEqualStrings("{\"flag\":true,\"label\":0,\"name\":\"s0\",\"score\":0.0}", r.json);
    try std.testing.expectEqual(@as(usize, 3), r.stored_payload.len);
    try std.testing.expectError(error.InvalidCache, split("\xff\x00\x00\x00\x00\x00\x00\x00{}"));
    try std.testing.expectError(error.InvalidCache, split("\x01\x00"));
}

test "fuzz: record splitting never reads out of bounds" {
    var prng = std.Random.DefaultPrng.init(7);
    const random = prng.random();
    var buf: [64]u8 = undefined;
    for (0..20000) |_| {
        const len = random.uintAtMost(usize, buf.len);
        random.bytes(buf[0..len]);
        if (len >= 8 and random.boolean()) std.mem.writeInt(u64, buf[0..8], random.uintAtMost(u64, 80), .little);
        if (split(buf[0..len])) |r| {
            try std.testing.expectEqual(len, header_bytes + r.json.len + r.stored_payload.len);
            try std.testing.expectEqual(@as(?usize, r.payload_offset), payloadOffset(buf[0..len]));
        } else |err| {
            try std.testing.expectEqual(error.InvalidCache, err);
            try std.testing.expectEqual(@as(?usize, null), payloadOffset(buf[0..len]));
        }
    }
}
