"""The web console: a single-page app every broker serves at ``/ui/``.

No extra process and no build step: three files in ``console_static/``
(HTML, JavaScript, CSS) ship in the package, are read once at start-up and
served from memory; nothing is loaded from the internet. The page talks to
the broker it came from through the same JSON endpoints the CLI uses
(``/v1/cluster``, ``/v1/topics``, ``/v1/groups``, the admin routes, the REST
proxy's records), so what it shows and may do is what the caller's
credentials and ACLs allow, checked by those endpoints. The assets hold no
data; their routes need no ACL.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).with_name("console_static")
#: Asset name -> its Content-Type.
ASSETS = {"index.html": "text/html", "console.js": "text/javascript",
          "console.css": "text/css"}
#: What a console page may load and call: only this broker.
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                      "style-src 'self'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
           "Referrer-Policy": "no-referrer"}
ROUTES = (("GET", "/ui"), ("GET", "/ui/"), ("GET", "/ui/static/{name}"))


class Console:
    """The console's routes on a broker's app."""

    def __init__(self) -> None:
        self.assets = {name: (STATIC_DIR / name).read_bytes() for name in ASSETS}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/ui", self.handle_root)
        app.router.add_get("/ui/", self.handle_index)
        app.router.add_get("/ui/static/{name}", self.handle_asset)

    async def handle_root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    async def handle_index(self, request: web.Request) -> web.Response:
        return self._asset("index.html")

    async def handle_asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in ASSETS:
            raise web.HTTPNotFound(text=f"no console asset {name!r}")
        return self._asset(name)

    def _asset(self, name: str) -> web.Response:
        return web.Response(body=self.assets[name], content_type=ASSETS[name],
                            charset="utf-8", headers=HEADERS)
