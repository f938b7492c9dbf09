"""How the browser tests find the app's page drawn. Gradio loads each component's code on its own, so
under load the parts of a tab are drawn in any order and late (a CI run found no #chatbot after the
message box); every tab but Chat is made when first opened (chat/ui/lazy.py); and the page's head
(the live text's Markdown parser, the keyboard and markup fixes) comes after the message box. A test
that looks at the page once, without waiting for what it looks at, fails or passes falsely then."""

from __future__ import annotations

# What each tab shows once drawn: its first and last parts (a part that is not visible is not in the
# page at all, so only parts that always show), and for the tabs that fill themselves as they open,
# the sign that they have.
TAB_PARTS = {
    "Chat": ["#message textarea", "#chatbot"],
    "Compare": ["#compare-intro", "#compare-prompt textarea", "#compare-summary", "#compare-ttft-plot svg",
                "#compare-speed-plot svg", "#compare-share"],
    "Leaderboard": ["#leaderboard-intro", "#leaderboard-table", "#leaderboard-png"],
    "Monitor": ["#monitor-intro"],
    "Capacity": ["#capacity-intro", "#capacity-run", "#capacity-png"],
}
TAB_FILLED = {
    "Leaderboard": "document.querySelector('#leaderboard-export-leaderboard-json')?.disabled === false",
    "Monitor": "!!document.querySelector('#monitor-empty, #monitor-charts')",
}


def wait_drawn(page) -> None:
    """Wait for the Chat tab as a person finds it on opening the page. Until the live text's parser
    has loaded, a reply's text shows only with Gradio's redraws, once a second, and a short reply
    would not be seen growing; a person who has typed has given it that time. The settings may be
    hidden (a phone's are), but they are drawn."""
    wait_tab_drawn(page, "Chat")
    page.wait_for_selector("#preset input", state="attached")
    page.wait_for_function("window.chatLive?.render('x') != null")


def wait_tab_drawn(page, name: str) -> None:
    for part in TAB_PARTS.get(name, []):
        page.wait_for_selector(part, state="attached")
    if name in TAB_FILLED:
        page.wait_for_function(TAB_FILLED[name])


def open_tab(page, name: str) -> None:
    """Click a tab (from "More tabs" where the tab row has no room for it), and wait for it drawn."""
    tab = page.get_by_role("tab", name=name)
    if tab.count() and tab.is_visible():
        tab.click()
    else:
        page.get_by_role("button", name="More tabs").click()
        page.locator(".overflow-dropdown button", has_text=name).click()
    wait_tab_drawn(page, name)
