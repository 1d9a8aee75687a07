//! Metadata schema types shared by every layer: the four value kinds a cache can store
//! and a named field. The numeric values of `Kind` are part of the C ABI
//! (`DRT_KIND_*` in dataset_rt.h) and never change.

const std = @import("std");

/// Kind of one metadata column, as written in `manifest.json` (`"bool"`, `"int"`,
/// `"float"`, `"string"`) and stored in `metadata.arrow` (boolean, int64, float64, utf8).
pub const Kind = enum(u8) {
    bool = 0,
    int = 1,
    float = 2,
    string = 3,

    /// The manifest spelling of the kind.
    pub fn name(kind: Kind) []const u8 {
        return switch (kind) {
            .bool => "bool",
            .int => "int",
            .float => "float",
            .string => "string",
        };
    }

    /// Parses the manifest spelling; null for anything else.
    pub fn fromName(text: []const u8) ?Kind {
        inline for (.{ Kind.bool, Kind.int, Kind.float, Kind.string }) |kind| {
            if (std.mem.eql(u8, text, kind.name())) return kind;
        }
        return null;
    }
};

/// One metadata column. Schemas are slices of fields sorted by `name` in byte order,
/// which is also the key order of the embedded record JSON.
pub const Field = struct {
    name: []const u8,
    kind: Kind,
};

/// One metadata value of a sample. `null` appears only when parsing embedded JSON, where
/// the reference stores NaN and infinite floats as `null`.
pub const Value = union(enum) {
    bool: bool,
    int: i64,
    float: f64,
    string: []const u8,
    null,
};

/// True when `fields` is strictly sorted by name in byte order (no duplicates).
pub fn isSorted(fields: []const Field) bool {
    if (fields.len < 2) return true;
    for (fields[0 .. fields.len - 1], fields[1..]) |a, b| {
        if (std.mem.order(u8, a.name, b.name) != .lt) return false;
    }
    return true;
}

test "kind names round trip" {
    inline for (.{ Kind.bool, Kind.int, Kind.float, Kind.string }) |kind| {
        try std.testing.expectEqual(kind, Kind.fromName(kind.name()).?);
    }
    try std.testing.expect(Kind.fromName("double") == null);
}

test "schema order is byte order" {
    const fields = [_]Field{ .{ .name = "B", .kind = .int }, .{ .name = "_", .kind = .int }, .{ .name = "a", .kind = .int } };
    try std.testing.expect(isSorted(&fields));
    const bad = [_]Field{ .{ .name = "a", .kind = .int }, .{ .name = "B", .kind = .int } };
    try std.testing.expect(!isSorted(&bad));
}
