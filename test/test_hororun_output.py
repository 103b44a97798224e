"""hororun's output (runner/output.py): rank prefixes, whole lines from every rank, per-rank files,
--rank-filter, timestamps, and readers that go away. Real processes on loopback, as in
test_hororun.py."""
import os
import re
import subprocess
import sys

from hororun_helpers import hororun, hororun_cmd, worker


def test_prefixes_partial_lines_and_carriage_returns(child_env):
    code = """
        import os, sys
        r = os.environ["HORO_RANK"]
        sys.stdout.write(f"a{r}\\nb{r}\\r\\nc{r}\\rd{r}")
        sys.stderr.write(f"e{r}\\n")
    """
    proc = hororun(child_env, "-np", "2", *worker(code))
    assert proc.returncode == 0, proc.stderr
    out, err = proc.stdout.decode(), proc.stderr.decode()
    for r in range(2):
        for piece in (f"[{r}]<stdout>:a{r}\n", f"[{r}]<stdout>:b{r}\r\n",
                      f"[{r}]<stdout>:c{r}\r", f"[{r}]<stdout>:d{r}\n"):
            assert piece in out
        assert f"[{r}]<stderr>:e{r}\n" in err
    assert re.fullmatch(r"(\[[01]\]<stdout>:[a-d][01](\r\n|\r|\n))+", out), out


def test_lines_from_ranks_never_interleave(child_env):
    code = """
        import os, sys
        r = os.environ["HORO_RANK"]
        for i in range(300):
            sys.stdout.write(f"rank {r} line {i} " + "x" * 3000 + "\\n")
    """
    proc = hororun(child_env, "-np", "4", *worker(code))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().split("\n")
    assert lines[-1] == ""
    pattern = re.compile(r"\[(\d)\]<stdout>:rank \1 line \d+ x{3000}")
    assert all(pattern.fullmatch(line) for line in lines[:-1])
    assert len(lines) - 1 == 4 * 300


def test_output_filename_tees_per_rank(child_env, tmp_path):
    code = """
        import os, sys
        r = os.environ["HORO_RANK"]
        print(f"out {r}")
        print(f"err {r}", file=sys.stderr)
    """
    out_dir = tmp_path / "logs"
    proc = hororun(child_env, "-np", "2", "--output-filename", str(out_dir), *worker(code))
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        assert (out_dir / f"rank.{r}" / "stdout").read_text() == f"[{r}]<stdout>:out {r}\n"
        assert (out_dir / f"rank.{r}" / "stderr").read_text() == f"[{r}]<stderr>:err {r}\n"
    assert "[1]<stdout>:out 1\n" in proc.stdout.decode()


def test_reader_that_goes_away_drops_lines_but_not_the_job(child_env, tmp_path):
    """`hororun ... | head`: the launcher keeps draining the workers, the job finishes normally with
    no traceback, and the per-rank files still receive every line."""
    code = """
        import os
        r = os.environ["HORO_RANK"]
        for i in range(20000):
            print(f"line {i} of rank {r}")
    """
    out_dir = tmp_path / "logs"
    proc = subprocess.Popen(hororun_cmd("-np", "2", "--output-filename", str(out_dir), *worker(code)),
                            env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    first = proc.stdout.readline()
    proc.stdout.close()  # 800 KB are on their way: the launcher's next writes find no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert b"<stdout>:line 0 of rank" in first
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    for r in range(2):
        assert (out_dir / f"rank.{r}" / "stdout").read_text().count("\n") == 20000


def test_rank_dir_names_are_zero_padded(runner_path):
    from horo_runner.output import rank_dir_name
    assert [rank_dir_name(r, 11) for r in (0, 3, 10)] == ["rank.00", "rank.03", "rank.10"]
    assert rank_dir_name(0, 1) == "rank.0"


def test_split_lines_keeps_cr_lf_split_across_reads(runner_path):
    from horo_runner.output import split_lines
    lines, rest = split_lines(b"", b"a\r")
    assert (lines, rest) == ([], b"a\r")
    lines, rest = split_lines(rest, b"\nb\rc")
    assert (lines, rest) == ([b"a\r\n", b"b\r"], b"c")


def test_split_lines_cuts_any_chunking_like_the_whole_stream(runner_path):
    from hypothesis import given, settings, strategies as st

    from horo_runner.output import split_lines

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n"]), max_size=30), st.data())
    def cut_anyhow(pieces, data):
        stream = b"".join(pieces)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
        lines, rest = [], bytearray()
        for a, b in zip([0] + cuts, cuts + [len(stream)]):
            if a < b:
                got, rest = split_lines(rest, stream[a:b])
                lines += got
        whole = re.findall(rb"[^\r\n]*(?:\r\n|\r(?!$)|\n)", stream)
        assert (lines, bytes(rest)) == (whole, stream[sum(map(len, whole)):])

    cut_anyhow()


def test_split_lines_extends_a_long_line_in_place(runner_path):
    # A line of n bytes read in chunks costs O(n), not O(n**2): the remainder is neither copied
    # nor scanned again for each chunk (a 12 MB line took 65 s before).
    from horo_runner.output import split_lines
    lines, rest = split_lines(b"", b"x" * 1000)
    for _ in range(3):
        more, again = split_lines(rest, b"y" * 1000)
        assert more == [] and again is rest
    lines, rest = split_lines(rest, b"z\n")
    assert lines == [b"x" * 1000 + b"y" * 3000 + b"z\n"] and rest == b""


def test_a_long_line_and_bytes_the_terminal_cannot_encode(child_env):
    # The worker's bytes pass as they are: before, an ascii stdout made the output thread die on
    # "caf\xc3\xa9", the worker got SIGPIPE and its later lines were lost.
    env = dict(child_env, PYTHONIOENCODING="ascii")
    proc = hororun(env, "-np", "1", *worker("""
        import sys
        sys.stdout.buffer.write(b"caf\\xc3\\xa9 \\xff\\n" + b"x" * 300000 + b"\\nafter\\n")
    """))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == b"[0]<stdout>:caf\xc3\xa9 \xff\n[0]<stdout>:" + b"x" * 300000 + b"\n[0]<stdout>:after\n"


def test_rank_filter_shows_those_ranks_and_a_hidden_failure(child_env, tmp_path):
    code = """
        import os, sys
        r = int(os.environ["HORO_RANK"])
        print(f"out {r}")
        print(f"err {r}", file=sys.stderr)
        if len(sys.argv) > 1:
            sys.exit("rank 2 gave up") if r == 2 else __import__("time").sleep(60)
    """
    out_dir = tmp_path / "logs"
    proc = hororun(child_env, "-np", "3", "--rank-filter", "0,2-2", "--output-filename", str(out_dir),
                   *worker(code))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.decode().splitlines()) == ["[0]<stdout>:out 0", "[2]<stdout>:out 2"]
    assert sorted(proc.stderr.decode().splitlines()) == ["[0]<stderr>:err 0", "[2]<stderr>:err 2"]
    assert (out_dir / "rank.1" / "stdout").read_text() == "[1]<stdout>:out 1\n"  # the files get every rank's

    proc = hororun(child_env, "-np", "3", "--rank-filter", "1", *worker(code), "fail")
    assert proc.returncode == 1
    assert set(proc.stdout.decode().splitlines()) <= {"[1]<stdout>:out 1"}  # rank 1 may be ended before it prints
    err = proc.stderr.decode()
    assert err.endswith("hororun: the last 2 lines of rank 2's stderr, which --rank-filter hid:\n"
                        "[2]<stderr>:err 2\n[2]<stderr>:rank 2 gave up\n"
                        "hororun: rank 2 exited with code 1; terminated the remaining 2 ranks\n"), err
    assert "err 0" not in err

    for bad, says in (("0,3", "--rank-filter names rank 3, but the job has ranks 0 to 2"),
                      ("1-0", "'1-0' is not a rank or a range of ranks (like 0,2-3)"),
                      ("x", "'x' is not a rank or a range of ranks")):
        proc = hororun(child_env, "-np", "3", "--rank-filter", bad, *worker("print('never')"))
        assert proc.returncode == 2 and says in proc.stderr.decode() and not proc.stdout, proc.stderr


def test_prefix_timestamp(child_env):
    proc = hororun(child_env, "-np", "1", "-prefix-timestamp", *worker("print('hi')"))
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[0\]<stdout>:hi\n",
                        proc.stdout.decode())
