#!/usr/bin/env python3
"""Prints a config with N request rules, for bench/hit_instructions.sh --config: the cost of
evaluating rules on every hit. N-1 rules that a /page/ request does not match, of the kinds a site
writes (path prefixes, path regexes, a host, cookie, header and query conditions), then the
anonymous-visitor rule of the README, which every request matches. N = 0 prints no rule."""
import sys

n = int(sys.argv[1])
out = []
for i in range(max(n - 1, 0)):
    kind = i % 5
    if kind == 0:
        out.append(f'[[rules]]\npath = "/static/{i}/"\nstrip_cookies = true\nttl = "1h"')
    elif kind == 1:
        out.append(f'[[rules]]\npath_regex = "^/api/v[0-9]+/{i}/"\npass = true')
    elif kind == 2:
        out.append(f'[[rules]]\nhost = "admin{i}.example.test"\npass = true')
    elif kind == 3:
        out.append(f'[[rules]]\npath = "/shop/{i}/"\ncookie = "cart{i}"\npass = true')
    else:
        out.append(f'[[rules]]\npath_regex = "\\\\.(css|js)$"\nquery = "v{i}"\nttl = "1d"')
if n > 0:
    out.append('[[rules]]\npath = "/"\ncache_anonymous_only = ["sessionid", "_session_id"]\n'
               'drop_query = ["utm_", "fbclid", "gclid"]')
print("\n\n".join(out))
