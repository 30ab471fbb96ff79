"""The web chat page in a real browser: headless Chromium (Debian's chromium
and chromium-driver) driven by Selenium loads /, asks a question, watches the
answer arrive piece by piece, asks for a long answer and presses Stop, and
saves a screenshot to the test's output folder (BARATA_TEST_OUT)."""
import json
import os
import shutil
import sys
import time

from common import Server, check

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
    msg = "Chromium or chromedriver is not installed (scripts/setup.sh installs chromium, chromium-driver)"
    if os.environ.get("BARATA_REQUIRE_DATA") == "1":
        sys.exit("error: " + msg)
    print("Skipped: " + msg)
    sys.exit(77)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

out_dir = os.environ.get("BARATA_TEST_OUT", ".")
os.makedirs(out_dir, exist_ok=True)
opts = webdriver.ChromeOptions()
opts.binary_location = CHROMIUM
for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
          "--window-size=1000,760", "--no-first-run", "--disable-extensions"):
    opts.add_argument(a)

with Server("--slots", "2", "-t", "2") as s:
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        driver.get(s.url + "/")
        check(driver.title == "barata", f"the page loads: title {driver.title!r}")
        t0 = time.time()
        while "SmolLM2" not in driver.find_element(By.ID, "model").text and time.time() - t0 < 10:
            time.sleep(0.05)
        check("SmolLM2" in driver.find_element(By.ID, "model").text, "the page names the model (GET /v1/models)")

        def last_reply():
            return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant, .msg.error")[-1]

        # Every text the page puts into a reply, as the browser applies it: a
        # MutationObserver's records keep each replaced text node, so chunks
        # that arrive in one network read (a fast model) are all seen, where
        # polling from here can miss them.
        driver.execute_script("""
          window.__lens = [];
          new MutationObserver(recs => {
            for (const r of recs)
              if (r.target.classList && r.target.classList.contains('assistant'))
                for (const n of r.addedNodes)
                  if (n.nodeType === 3) window.__lens.push(n.data.length);
          }).observe(document.body, {subtree: true, childList: true});
        """)
        box = driver.find_element(By.ID, "input")
        box.send_keys("What is the capital of France?")
        box.send_keys(Keys.ENTER)
        # Watch the reply grow: sample its length until it is done.
        lengths = []
        t0 = time.time()
        while time.time() - t0 < 60:
            els = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant, .msg.error")
            if els:
                el = els[-1]
                lengths.append(len(el.text))
                if el.get_attribute("data-done"):
                    break
            time.sleep(0.01)
        el = last_reply()
        check(el.get_attribute("data-done") in ("stop", "length"),
              f"the reply finished ({el.get_attribute('data-done')}): {el.text[:60]!r}")
        growth = sorted(set(lengths + (driver.execute_script("return window.__lens") or [])))
        chunks = int(el.get_attribute("data-chunks"))
        check(chunks >= 3 and len(growth) >= 3,
              f"it arrived token by token: {chunks} chunks, seen at {len(growth)} lengths")
        stats = driver.find_element(By.ID, "last-stats").text
        check("TTFT" in stats and "tokens/s" in stats, f"the stats line: {stats!r}")

        # A long answer, stopped after a few pieces.
        driver.find_element(By.TAG_NAME, "summary").click()
        mt = driver.find_element(By.ID, "maxtok")
        mt.clear()
        mt.send_keys("3000")
        driver.find_element(By.ID, "system").send_keys("You are a storyteller.")
        driver.find_element(By.TAG_NAME, "summary").click()
        box.send_keys("Tell me a very long story about a lighthouse.")
        box.send_keys(Keys.ENTER)
        t0 = time.time()
        while time.time() - t0 < 30:
            el = last_reply()
            if int(el.get_attribute("data-chunks") or 0) >= 5:
                break
            time.sleep(0.01)
        check(int(last_reply().get_attribute("data-chunks") or 0) >= 5, "the long reply streams")
        driver.find_element(By.ID, "stop").click()
        t0 = time.time()
        while not last_reply().get_attribute("data-done") and time.time() - t0 < 10:
            time.sleep(0.02)
        check(last_reply().get_attribute("data-done") == "stopped", "Stop ends the reply in the page")
        cancelled = 0
        t0 = time.time()
        while time.time() - t0 < 10:
            m = s.metrics()
            cancelled = m["barata_requests_cancelled_total"]
            if cancelled >= 1 and m["barata_slots_in_use"] == 0:
                break
            time.sleep(0.05)
        check(cancelled >= 1, "Stop cancelled the request on the server (its slot is free)")
        n_msgs = len(driver.find_elements(By.CSS_SELECTOR, ".msg"))
        check(n_msgs == 4, f"the conversation keeps both turns: {n_msgs} messages")
        ids = driver.execute_script(
            "return Array.from(document.querySelectorAll('[id]'), e => e.id)")
        check(len(ids) == len(set(ids)), f"after two replies the page's {len(ids)} element ids "
              f"are unique")
        shot = os.path.join(out_dir, "chat-page.png")
        driver.save_screenshot(shot)
        check(os.path.getsize(shot) > 1000, f"screenshot saved: {shot}")

        # JSON mode: the reply is a JSON object (response_format json_object).
        driver.find_element(By.ID, "clear").click()
        driver.find_element(By.TAG_NAME, "summary").click()
        mt = driver.find_element(By.ID, "maxtok")
        mt.clear()
        mt.send_keys("200")
        driver.find_element(By.ID, "jsonmode").click()
        driver.find_element(By.TAG_NAME, "summary").click()
        box.send_keys("Describe a cat.")
        box.send_keys(Keys.ENTER)
        t0 = time.time()
        while not last_reply().get_attribute("data-done") and time.time() - t0 < 60:
            time.sleep(0.02)
        done = last_reply().get_attribute("data-done")
        text = last_reply().text
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        # The small model may run to max_tokens inside the object: then a prefix of one.
        check(text.startswith("{") and (isinstance(parsed, dict) or done == "length"),
              f"JSON mode gives a JSON object ({done}): {text[:80]!r}")
    finally:
        driver.quit()
print("test_browser: all passed")
