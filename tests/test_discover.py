"""``keras-adapt discover``: caps, atomic updates, malformed input, Horovod's reading of it."""

import os
import subprocess
import sys
import textwrap

import pytest

from keras_adapt import discover

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_ADAPT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _discover(*args, **env):
    return subprocess.run([sys.executable, "-m", "keras_adapt", "discover", *args],
                          env=_env(**env), capture_output=True, text=True, timeout=60)


@pytest.fixture
def files(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two machines\n\nnode-a:2   # first\nnode-b:2\n")
    return str(hosts), str(tmp_path / "target")


# -- the rule -------------------------------------------------------------------

@pytest.mark.parametrize("target, expected", [
    (None, "node-a:2\nnode-b:2"),
    (0, "node-a:2\nnode-b:2"),
    (4, "node-a:2\nnode-b:2"),
    (9, "node-a:2\nnode-b:2"),   # more than there is: all of it
    (3, "node-a:2\nnode-b:1"),
    (2, "node-a:2"),
    (1, "node-a:1"),
])
def test_total_slots_are_trimmed_from_the_end(files, target, expected):
    hosts, target_file = files
    if target is not None:
        discover.write_target(target_file, target)
    assert discover.discover(hosts_file=hosts, target_file=target_file) == expected
    assert discover.discover(hosts="node-a:2,node-b:2", target_file=target_file) == expected


def test_hosts_file_syntax():
    parsed = discover.parse_hosts("a\n  b:3 # comment\n\n# c:9\nd:1, e:2\n10.0.0.7:4\n")
    assert parsed == [("a", 1), ("b", 3), ("d", 1), ("e", 2), ("10.0.0.7", 4)]
    assert discover.cap_hosts(parsed, 5) == [("a", 1), ("b", 3), ("d", 1)]
    assert sum(s for _, s in discover.cap_hosts(parsed, 7)) == 7


@pytest.mark.parametrize("text, message", [
    ("a:0\n", "line 1: 'a:0' is not valid"),
    ("a:2\nb:two\n", "line 2: 'b:two' is not valid"),
    ("a:2:3\n", "'a:2:3' is not valid"),
    ("a b:2\n", "'a b:2' is not valid"),
    ("a:2\na:1\n", "host 'a' is listed twice"),
    ("# nothing\n\n", "lists no host"),
])
def test_malformed_hosts_name_the_line_and_the_fix(text, message):
    with pytest.raises(ValueError, match="hosts file F") as info:
        discover.parse_hosts(text, source="hosts file F")
    assert message in str(info.value)
    assert ("e.g. node-1:2" in str(info.value)) or ("list each host once" in str(info.value))


@pytest.mark.parametrize("content, expected", [
    ("3", 3), ("3\n", 3), ("  12 \n", 12), ("0\n", None), ("", None), ("\n", None)])
def test_target_file_is_read_tolerantly(tmp_path, content, expected):
    path = tmp_path / "target"
    path.write_text(content)
    assert discover.read_target(str(path)) == expected


@pytest.mark.parametrize("content", ["-1", "2.5", "two", "3 4"])
def test_malformed_target_names_the_file_content_and_fix(tmp_path, content):
    path = tmp_path / "target"
    path.write_text(content)
    with pytest.raises(ValueError) as info:
        discover.read_target(str(path))
    assert str(path) in str(info.value) and repr(content) in str(info.value)
    assert "int >= 0" in str(info.value)
    with pytest.raises(ValueError, match="workers=-1 is not valid"):
        discover.write_target(str(path), -1)


def test_answer_is_cached_next_to_the_target_only_when_it_changes(files):
    hosts, target_file = files
    last = target_file + discover.LAST_SUFFIX
    discover.write_target(target_file, 3)
    discover.discover(hosts_file=hosts, target_file=target_file)
    assert open(last).read() == "node-a:2\nnode-b:1\n"
    mtime = os.stat(last).st_mtime_ns
    discover.discover(hosts_file=hosts, target_file=target_file)
    assert os.stat(last).st_mtime_ns == mtime
    discover.write_target(target_file, 1)
    discover.discover(hosts_file=hosts, target_file=target_file)
    assert open(last).read() == "node-a:1\n"
    # No target file: the cache lives next to the hosts file.
    discover.discover(hosts_file=hosts)
    assert open(hosts + discover.LAST_SUFFIX).read() == "node-a:2\nnode-b:2\n"


# -- the exclusion file ------------------------------------------------------

def test_excluded_hosts_are_left_out_before_the_cap(files, tmp_path):
    hosts, target_file = files
    exclude = str(tmp_path / "excluded")
    three = "node-a:2,node-b:2,node-c:1"
    assert discover.discover(hosts=three, exclude_file=exclude) == "node-a:2\nnode-b:2\nnode-c:1"
    open(exclude, "w").write("# slow\nnode-b\nnode-z   # not in the hosts: ignored\n")
    assert discover.discover(hosts=three, exclude_file=exclude) == "node-a:2\nnode-c:1"
    # The cap counts the hosts left: a spare host takes the excluded one's place.
    discover.write_target(target_file, 3)
    assert discover.discover(hosts=three, target_file=target_file,
                             exclude_file=exclude) == "node-a:2\nnode-c:1"
    discover.write_target(target_file, 2)
    assert discover.discover(hosts_file=hosts, target_file=target_file,
                             exclude_file=exclude) == "node-a:2"
    open(exclude, "w").write("node-a\n")
    assert discover.discover(hosts_file=hosts, target_file=target_file,
                             exclude_file=exclude) == "node-b:2"
    # Every host excluded: an error naming the file and how to bring one back.
    open(exclude, "w").write("node-a\nnode-b\n")
    with pytest.raises(ValueError, match="excludes every host") as info:
        discover.discover(hosts_file=hosts, exclude_file=exclude)
    assert exclude in str(info.value) and "remove a line" in str(info.value)


def test_exclusion_file_syntax():
    text = "# excluded by StragglerPolicy\n\nnode-b\n  10.0.0.7   # slow\nnode-b\n"
    assert discover.parse_excluded(text) == ["node-b", "10.0.0.7"]
    assert discover.parse_excluded("") == []
    for text, line in (("node-a\nnode-b:2\n", 2), ("a b\n", 1), ("ok\n\nx,y\n", 3)):
        with pytest.raises(ValueError) as info:
            discover.parse_excluded(text, source="exclusion file F")
        assert f"exclusion file F line {line}" in str(info.value)
        assert "one host per line" in str(info.value) and "e.g. node-2" in str(info.value)


def test_exclude_host_appends_once_and_keeps_the_file(tmp_path):
    path = str(tmp_path / "excluded")
    assert discover.read_excluded(path) == []
    assert discover.exclude_host(path, "node-b") is True
    assert open(path).read() == "node-b\n"
    open(path, "w").write("# by hand, no newline at the end\nnode-a")
    assert discover.exclude_host(path, "node-b") is True
    assert discover.exclude_host(path, "node-a") is False   # already there: not written
    assert open(path).read() == "# by hand, no newline at the end\nnode-a\nnode-b\n"
    assert discover.read_excluded(path) == ["node-a", "node-b"]
    with pytest.raises(ValueError, match="host='a b' is not a host name"):
        discover.exclude_host(path, "a b")
    # A malformed file is left as it is.
    open(path, "w").write("node-a:1\n")
    with pytest.raises(ValueError, match="'node-a:1' is not a host name"):
        discover.exclude_host(path, "node-c")
    assert open(path).read() == "node-a:1\n"
    assert sorted(os.listdir(tmp_path)) == ["excluded"]   # no temporary file left


# -- the command --------------------------------------------------------------

def test_command_prints_capped_hosts_from_options_and_from_the_environment(files):
    hosts, target_file = files
    discover.write_target(target_file, 3)
    proc = _discover("--hosts-file", hosts, "--target-file", target_file)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "node-a:2\nnode-b:1\n", "")
    proc = _discover(KERAS_ADAPT_HOSTS_FILE=hosts, KERAS_ADAPT_TARGET_FILE=target_file)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "node-a:2\nnode-b:1\n", "")
    proc = _discover(KERAS_ADAPT_HOSTS="h1:1,h2:4", KERAS_ADAPT_TARGET_FILE=target_file)
    assert (proc.returncode, proc.stdout) == (0, "h1:1\nh2:2\n")
    proc = _discover("--hosts", "h1:1,h2:4")
    assert (proc.returncode, proc.stdout) == (0, "h1:1\nh2:4\n")


@pytest.mark.parametrize("breakage, message", [
    ("target", "'three' is not a worker count"),
    ("hosts", "line 2: 'node-b:-2' is not valid"),
    ("no-hosts", "does not exist; create it"),
    ("empty-hosts", "lists no host"),
])
def test_bad_input_prints_error_and_last_good_answer_with_exit_0(files, breakage, message):
    hosts, target_file = files
    discover.write_target(target_file, 3)
    good = _discover("--hosts-file", hosts, "--target-file", target_file)
    assert good.stdout == "node-a:2\nnode-b:1\n"
    if breakage == "target":
        open(target_file, "w").write("three\n")
    elif breakage == "hosts":
        open(hosts, "w").write("node-a:2\nnode-b:-2\n")
    elif breakage == "no-hosts":
        os.unlink(hosts)
    else:
        open(hosts, "w").write("# all commented out\n")
    proc = _discover("--hosts-file", hosts, "--target-file", target_file)
    assert proc.returncode == 0
    assert proc.stdout == "node-a:2\nnode-b:1\n"
    assert message in proc.stderr
    assert "last good answer from " + target_file + ".last" in proc.stderr
    # The fallback does not overwrite the last good answer.
    assert open(target_file + ".last").read() == "node-a:2\nnode-b:1\n"


def test_command_reads_the_exclusion_file_and_keeps_the_last_good_answer(files, tmp_path):
    hosts, target_file = files
    exclude = str(tmp_path / "excluded")
    open(exclude, "w").write("node-a\n")
    proc = _discover("--hosts-file", hosts, "--exclude-file", exclude)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "node-b:2\n", "")
    discover.write_target(target_file, 1)
    proc = _discover(KERAS_ADAPT_HOSTS_FILE=hosts, KERAS_ADAPT_TARGET_FILE=target_file,
                     KERAS_ADAPT_EXCLUDE_FILE=exclude)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "node-b:1\n", "")
    # Malformed, or excluding every host: the error and the last good answer.
    for text, message in (("node-a:2\n", "line 1: 'node-a:2' is not a host name"),
                          ("node-a\nnode-b\n", "excludes every host (node-a, node-b)")):
        open(exclude, "w").write(text)
        proc = _discover("--hosts-file", hosts, "--target-file", target_file,
                         "--exclude-file", exclude)
        assert (proc.returncode, proc.stdout) == (0, "node-b:1\n")
        assert message in proc.stderr
        assert "last good answer from " + target_file + ".last" in proc.stderr
    # A fixed host list and an exclusion file alone: cached next to the exclusion file.
    open(exclude, "w").write("h1\n")
    proc = _discover("--hosts", "h1:1,h2:4", "--exclude-file", exclude)
    assert (proc.returncode, proc.stdout) == (0, "h2:4\n")
    assert open(exclude + discover.LAST_SUFFIX).read() == "h2:4\n"
    open(exclude, "w").write("h1\nh2\n")
    proc = _discover("--hosts", "h1:1,h2:4", "--exclude-file", exclude)
    assert (proc.returncode, proc.stdout) == (0, "h2:4\n")
    assert "excludes every host" in proc.stderr and exclude + ".last" in proc.stderr


def test_bad_input_without_a_last_good_answer_fails_loudly(files):
    hosts, target_file = files
    open(target_file, "w").write("many\n")
    proc = _discover("--hosts-file", hosts, "--target-file", target_file)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert "'many' is not a worker count" in proc.stderr
    assert "no last good answer" in proc.stderr
    proc = _discover()
    assert proc.returncode == 2 and "not neither" in proc.stderr
    assert "--hosts-file F" in proc.stderr and "KERAS_ADAPT_HOSTS_FILE" in proc.stderr


# -- atomic updates -----------------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys, time
    from keras_adapt import discover
    path, stop = sys.argv[1], time.time() + float(sys.argv[2])
    n = 0
    while time.time() < stop:
        # Lengths differ (1 and 9 digits), so a torn read would show.
        discover.write_target(path, (1, 123456789)[n % 2])
        n += 1
    print(n)
""")

_READER = textwrap.dedent("""
    import sys, time
    from keras_adapt import discover
    path, stop = sys.argv[1], time.time() + float(sys.argv[2])
    seen = {}
    while time.time() < stop:
        try:
            value = discover.read_target(path)
        except ValueError as exc:
            value = "error: " + str(exc)
        seen[repr(value)] = seen.get(repr(value), 0) + 1
    print(seen)
""")


def test_a_reader_never_sees_a_partial_target(tmp_path):
    path = str(tmp_path / "target")
    discover.write_target(path, 1)
    seconds = "3"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, path, seconds], env=_env(),
                              stdout=subprocess.PIPE, text=True)
    reader = subprocess.Popen([sys.executable, "-c", _READER, path, seconds], env=_env(),
                              stdout=subprocess.PIPE, text=True)
    writes = int(writer.communicate(timeout=60)[0])
    seen = eval(reader.communicate(timeout=60)[0])  # noqa: S307 - our own repr of a dict
    assert writer.returncode == reader.returncode == 0
    assert writes > 100, writes
    # Both values were read many times, and nothing else ever was.
    assert set(seen) == {"1", "123456789"}, seen
    assert min(seen.values()) > 10, seen
    # No temporary file is left behind.
    assert sorted(os.listdir(tmp_path)) == ["target"]


def test_the_command_answers_consistently_while_the_target_changes(files):
    hosts, target_file = files
    discover.write_target(target_file, 1)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER.replace("123456789", "3"),
                               target_file, "4"], env=_env(), stdout=subprocess.PIPE, text=True)
    answers = {}
    try:
        for _ in range(30):
            proc = _discover("--hosts-file", hosts, "--target-file", target_file)
            assert (proc.returncode, proc.stderr) == (0, "")
            answers[proc.stdout] = answers.get(proc.stdout, 0) + 1
    finally:
        writer.communicate(timeout=60)
    assert set(answers) <= {"node-a:1\n", "node-a:2\nnode-b:1\n"}, answers
    assert sum(answers.values()) == 30


# -- Horovod reads it ---------------------------------------------------------

def test_horovod_reads_the_command_as_its_discovery_script(files, tmp_path):
    """Horovod's own discovery class runs the command line (it goes through a
    shell, so options work) and gets the capped hosts."""
    discovery = pytest.importorskip("horovod.runner.elastic.discovery")
    hosts, target_file = files
    discover.write_target(target_file, 3)
    command = (f"PYTHONPATH={ROOT} {sys.executable} -m keras_adapt discover "
               f"--hosts-file {hosts} --target-file {target_file}")
    assert discovery.HostDiscoveryScript(command, 1).find_available_hosts_and_slots() == \
        {"node-a": 2, "node-b": 1}
    # The two-line wrapper of docs/elastic_policies.md, an executable without arguments.
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m keras_adapt "
                      f"discover --hosts-file {hosts} --target-file {target_file}\n")
    script.chmod(0o755)
    discover.write_target(target_file, 1)
    assert discovery.HostDiscoveryScript(str(script), 1).find_available_hosts_and_slots() == \
        {"node-a": 1}
    # Malformed input mid-job: Horovod still gets the last good hosts.
    open(target_file, "w").write("x\n")
    assert discovery.HostDiscoveryScript(str(script), 1).find_available_hosts_and_slots() == \
        {"node-a": 1}
    # An excluded host is gone from what Horovod sees.
    exclude = tmp_path / "excluded"
    exclude.write_text("node-a\n")
    discover.write_target(target_file, 0)
    command += f" --exclude-file {exclude}"
    assert discovery.HostDiscoveryScript(command, 1).find_available_hosts_and_slots() == \
        {"node-b": 2}
