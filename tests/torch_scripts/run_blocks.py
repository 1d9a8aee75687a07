"""Run documentation code blocks in one namespace (like tests/test_docs.py does) and print
each block's standard output as a JSON list (run by tests/test_torch.py).

    python run_blocks.py BLOCKS_JSON_FILE
BLOCKS: [[first_line, code], ...]; a failing block prints its traceback and exits 1.
"""

import contextlib
import io
import json
import sys
import traceback


def main() -> None:
    blocks = json.loads(open(sys.argv[1], encoding="utf-8").read())
    namespace: dict[str, object] = {"__name__": "__main__"}
    outputs = []
    for line, code in blocks:
        compiled = compile("\n" * (line - 1) + code, "guide", "exec")
        stdout = io.StringIO()
        try:
            with contextlib.redirect_stdout(stdout):
                exec(compiled, namespace)
        except Exception:
            print(f"block at line {line} failed:\n{traceback.format_exc()}", file=sys.stderr)
            sys.exit(1)
        outputs.append(stdout.getvalue())
    print(json.dumps(outputs))


if __name__ == "__main__":
    main()
