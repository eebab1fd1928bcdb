"""Reads one final stage of the Dockerfile for images/build.sh, so that the daemonless build
applies the same image configuration as `docker build --target TARGET`.
Usage: stage.py DOCKERFILE TARGET VERSION. Prints JSON: labels, workdir, volumes, user,
exposed ports, entrypoint, and the COPY --from=builder lines (source, destination, owner).
Only the instruction forms the Dockerfile uses are understood; anything else in a final stage
is an error, so the two builds cannot silently drift apart."""
import json
import re
import shlex
import sys


def instructions(text):
    """(keyword, arguments) per instruction, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def stage(text, target, version):
    found, image = None, {
        "labels": {}, "workdir": None, "volumes": [], "user": None,
        "exposed": [], "entrypoint": None, "copies": [],
    }
    args = {"VERSION": version}
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            found = rest.split()[-1] == target and rest.split()[-2].upper() == "AS"
            continue
        if not found:
            continue
        expand = lambda s: re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], s)
        if keyword == "ARG":
            name = rest.split("=", 1)[0]
            if name != "VERSION":
                raise SystemExit(f"stage.py: ARG {name} in stage {target} is not understood")
        elif keyword == "LABEL":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                image["labels"][key] = expand(value)
        elif keyword == "WORKDIR":
            image["workdir"] = rest
        elif keyword == "VOLUME":
            image["volumes"] += rest.split()
        elif keyword == "USER":
            image["user"] = rest
        elif keyword == "EXPOSE":
            image["exposed"] += rest.split()
        elif keyword == "ENTRYPOINT":
            image["entrypoint"] = json.loads(rest)
        elif keyword == "COPY":
            words = rest.split()
            flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--"))
            paths = [w for w in words if not w.startswith("--")]
            if flags.get("from") != "builder" or len(paths) != 2:
                raise SystemExit(f"stage.py: COPY {rest} is not understood")
            image["copies"].append(
                {"source": paths[0], "destination": paths[1], "owner": flags.get("chown")})
        else:
            raise SystemExit(f"stage.py: {keyword} in stage {target} is not understood")
    if image["entrypoint"] is None:
        raise SystemExit(f"stage.py: no stage {target} with an ENTRYPOINT")
    return image


if __name__ == "__main__":
    dockerfile, target, version = sys.argv[1:4]
    print(json.dumps(stage(open(dockerfile).read(), target, version)))
