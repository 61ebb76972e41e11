// faste-mm search page: plain JavaScript, no dependencies, no network beyond this server.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { image: null, results: null, key: sessionStorage.getItem("faste-mm-key") || "" };

function headers() {
  return state.key ? { Authorization: "Bearer " + state.key } : {};
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...headers(), ...(options.headers || {}) } });
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    const message = (body && body.error && body.error.message) || response.statusText || "request failed";
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return body;
}

function showBanner(message, kind = "error", askKey = false) {
  $("banner").hidden = false;
  $("banner").className = "banner " + kind;
  $("banner-text").textContent = message;
  $("key-form").hidden = !askKey;
  if (askKey) $("key").focus();
}

function hideBanner() { $("banner").hidden = true; }

function failed(error, what) {
  if (error.status === 401) {
    showBanner("This server needs an API key.", "error", true);
  } else {
    showBanner(`${what} failed${error.status ? " (" + error.status + ")" : ""}: ${error.message}`);
  }
}

// ---- collection header ------------------------------------------------------------------------
async function loadInfo() {
  try {
    const info = await api("/info");
    const col = info.collection;
    if (!col) {
      $("collection").textContent = "embeddings only";
      showBanner("This server has no collection to search. Start it with: faste-mm serve -c NAME", "info");
      return info;
    }
    $("collection").innerHTML = "";
    const name = document.createElement("strong");
    name.textContent = col.name;
    const detail = document.createElement("span");
    detail.textContent = `${col.items.toLocaleString()} items · ${shortModel(info.model)} · ${info.dim}-d`;
    const plan = document.createElement("small");  // the receipt: what faste-mm plan measured, or "not measured"
    plan.className = "plan";
    plan.textContent = `plan: ${col.plan}`;
    $("collection").append(name, detail, plan);
    if (col.items === 0) {
      showBanner(`The collection "${col.name}" is empty. Index some files first: faste-mm index ./photos -c ${col.name}`, "info");
    }
    return info;
  } catch (error) {
    failed(error, "Loading the collection");
    return null;
  }
}

function shortModel(model) {
  const parts = String(model).split("/").filter(Boolean);
  return parts[parts.length - 1] || model;
}

// ---- searching ---------------------------------------------------------------------------------
async function search({ id = null, pushUrl = true } = {}) {
  const q = $("q").value.trim();
  const k = $("k").value;
  if (!q && !state.image && id === null) { $("q").focus(); return; }
  const form = new FormData();
  if (id !== null) {
    form.append("id", String(id));
  } else {
    if (q) form.append("q", q);
    if (state.image) form.append("image", state.image, state.image.name || "upload.png");
  }
  form.append("k", k);
  if (pushUrl) updateUrl(id, q, k);
  document.body.classList.add("busy");
  $("go").disabled = true;
  hideBanner();
  try {
    const result = await api("/search", { method: "POST", body: form });
    state.results = result;
    render(result, id !== null ? `items like #${id}` : describe(q));
  } catch (error) {
    failed(error, "Search");
  } finally {
    document.body.classList.remove("busy");
    $("go").disabled = false;
  }
}

function describe(q) {
  if (q && state.image) return `“${q}” + ${state.image.name || "image"}`;
  if (state.image) return state.image.name || "your image";
  return `“${q}”`;
}

function updateUrl(id, q, k) {
  const params = new URLSearchParams();
  if (id !== null) params.set("id", id);
  else if (q) params.set("q", q);
  if (k !== "12") params.set("k", k);
  const url = params.toString() ? "?" + params : location.pathname;
  history.pushState({}, "", url);
}

function render(result, label) {
  const grid = $("results");
  grid.innerHTML = "";
  $("hint").hidden = true;
  $("status").hidden = false;
  const n = result.hits.length;
  $("status-text").textContent = n
    ? `${n} result${n === 1 ? "" : "s"} for ${label} · ${Math.round(result.took_ms)} ms`
    : `No results for ${label}.`;
  const template = $("card");
  for (const hit of result.hits) {
    const card = template.content.firstElementChild.cloneNode(true);
    card.dataset.id = hit.id;
    const img = card.querySelector("img");
    if (hit.thumbnail) {
      loadThumbnail(img, hit.thumbnail);
      img.alt = hit.page ? `${hit.name}, page ${hit.page}` : hit.name;
      if (hit.page) card.querySelector(".thumb").classList.add("paged");
    } else {
      card.querySelector(".thumb").classList.add("textual");
      img.remove();
      const glyph = document.createElement("span");
      glyph.className = "glyph";
      glyph.textContent = "Aa";
      card.querySelector(".thumb").prepend(glyph);
    }
    card.querySelector(".rank").textContent = "#" + hit.rank;
    const name = card.querySelector(".name");
    name.textContent = hit.name;
    name.title = hit.uri;
    card.querySelector(".page").textContent = hit.page ? `page ${hit.page}` : "";
    const pct = Math.max(0, Math.min(1, hit.score)) * 100;
    card.querySelector(".bar > span").style.width = pct.toFixed(1) + "%";
    card.querySelector(".value").textContent = hit.score.toFixed(3);
    card.querySelector(".more").addEventListener("click", () => {
      clearImage();
      $("q").value = "";
      search({ id: hit.id });
      window.scrollTo({ top: 0, behavior: "smooth" });
    });
    grid.append(card);
  }
}

async function loadThumbnail(img, url) {
  if (!state.key) { img.src = url; return; }  // no key: the browser fetches (and caches) it itself
  try {  // with a key: fetch with the header, show the bytes
    const response = await fetch(url, { headers: headers() });
    if (response.ok) img.src = URL.createObjectURL(await response.blob());
  } catch (_) { /* the card keeps its placeholder */ }
}

// ---- image upload and drag-and-drop -------------------------------------------------------------
function setImage(file) {
  if (!file || !file.type.startsWith("image/")) {
    showBanner("That is not an image file; drop a PNG, JPEG, WebP or GIF.");
    return;
  }
  state.image = file;
  $("image-preview").src = URL.createObjectURL(file);
  $("image-name").textContent = file.name || "image";
  $("image-chip").hidden = false;
  search();
}

function clearImage() {
  state.image = null;
  $("image").value = "";
  $("image-chip").hidden = true;
}

function downloadResults() {
  if (!state.results) return;
  const blob = new Blob([JSON.stringify(state.results, null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "faste-mm-results.json";
  document.body.append(a);
  a.click();
  a.remove();
}

function fromUrl() {
  const params = new URLSearchParams(location.search);
  const k = params.get("k");
  if (k && [...$("k").options].some((o) => o.value === k)) $("k").value = k;
  if (params.has("id")) {
    $("q").value = "";
    search({ id: Number(params.get("id")), pushUrl: false });
  } else if (params.get("q")) {
    $("q").value = params.get("q");
    search({ pushUrl: false });
  }
}

function wire() {
  $("search-form").addEventListener("submit", (event) => { event.preventDefault(); search(); });
  $("image").addEventListener("change", () => setImage($("image").files[0]));
  $("image-clear").addEventListener("click", () => { clearImage(); $("q").focus(); });
  $("download").addEventListener("click", downloadResults);
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("key").value.trim();
    sessionStorage.setItem("faste-mm-key", state.key);
    hideBanner();
    loadInfo().then((info) => { if (info) fromUrl(); });
  });
  let depth = 0;
  const zone = $("dropzone");
  window.addEventListener("dragenter", (e) => { if (hasFile(e)) { depth++; zone.hidden = false; } });
  window.addEventListener("dragleave", () => { depth = Math.max(0, depth - 1); if (!depth) zone.hidden = true; });
  window.addEventListener("dragover", (e) => { if (hasFile(e)) e.preventDefault(); });
  window.addEventListener("drop", (e) => {
    e.preventDefault();
    depth = 0;
    zone.hidden = true;
    if (e.dataTransfer.files.length) setImage(e.dataTransfer.files[0]);
  });
  window.addEventListener("popstate", fromUrl);
}

function hasFile(event) {
  return event.dataTransfer && [...event.dataTransfer.types].includes("Files");
}

wire();
loadInfo().then((info) => { if (info) fromUrl(); });
