// faste-mm search page: the collection's albums (GET /albums), each a saved search shown as results.
// Loaded after app.js, whose helpers ($, api, render, failed, state) it uses.
"use strict";

async function loadAlbums() {
  let listed;
  try {
    listed = (await api("/albums")).albums;
  } catch (error) {
    if (error.status !== 404) failed(error, "Loading the albums");
    return;
  }
  const bar = $("albums");
  bar.querySelectorAll("button").forEach((b) => b.remove());
  bar.hidden = !listed.length;
  for (const album of listed) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "ghost album";
    button.dataset.album = album.name;
    button.textContent = album.name;
    button.title = album.query + (album.understood ? ` (${album.understood})` : "");
    button.addEventListener("click", () => showAlbum(album.name));
    bar.append(button);
  }
  const asked = new URLSearchParams(location.search).get("album");
  if (asked && listed.some((a) => a.name === asked)) showAlbum(asked, false);
}

async function showAlbum(name, pushUrl = true) {
  try {
    const started = performance.now();
    const album = await api("/albums/" + encodeURIComponent(name));
    state.results = album;
    render({ hits: album.hits, took_ms: performance.now() - started }, `album “${album.name}” (${album.query})`);
    for (const b of $("albums").querySelectorAll("button")) b.classList.toggle("active", b.dataset.album === name);
    if (pushUrl) history.pushState(null, "", "?album=" + encodeURIComponent(name));
  } catch (error) {
    failed(error, `Album ${name}`);
  }
}

loadAlbums();
