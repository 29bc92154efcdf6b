#!/usr/bin/env python3
"""Generates examples/replay/access.log (nginx combined) and access-msec.log (the same requests
with `$msec $request_time` in front): 40 ordinary clients, one scraper, one password guesser
behind the local proxy. Seeded: the output is always the same."""
import random, time

random.seed(7)
T0 = 1700000000  # 2023-11-14T22:13:20Z
MONTHS = 'Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec'.split()
reqs = []
def add(t, ip, method, path, xff='-'):
    reqs.append((t, ip, method, path, xff, random.choice([0.002, 0.004, 0.012, 0.030])))
for c in range(40):  # ordinary clients: a page every 1-5 s, sometimes a quick burst of 3
    t, ip = T0 + random.random() * 3, '192.0.2.%d' % (c + 10)
    while t < T0 + 30:
        for k in range(3 if random.random() < 0.2 else 1):
            add(t + k * 0.05, ip, 'GET', random.choice(['/api/items', '/api/cart', '/index.html']))
        t += random.uniform(1, 5)
for i in range(160):  # a scraper: 8 r/s for 20 s
    add(T0 + 5 + i / 8, '198.51.100.23', 'GET', '/api/items?page=%d' % i)
for i in range(30):  # a password guesser behind the trusted local proxy: 3 r/s for 10 s
    add(T0 + 10 + i / 3, '127.0.0.1', 'POST', '/login', xff='203.0.113.99')
reqs.sort(key=lambda r: r[0] + r[5])  # nginx logs a request when it ends
with open('access.log', 'w') as f, open('access-msec.log', 'w') as g:
    for (t, ip, m, p, xff, rt) in reqs:
        end = t + rt
        tm = time.gmtime(int(end))
        local = '%02d/%s/%d:%02d:%02d:%02d +0000' % (tm.tm_mday, MONTHS[tm.tm_mon - 1], tm.tm_year, tm.tm_hour, tm.tm_min, tm.tm_sec)
        tail = '%s - - [%s] "%s %s HTTP/1.1" 200 512 "-" "curl/8.5" "%s"' % (ip, local, m, p, xff)
        f.write(tail + '\n')
        g.write('%.3f %.3f %s\n' % (end, rt, tail))
