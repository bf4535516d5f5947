// A do-nothing admission webhook in Go (standard library only), for the bench's through-apiserver floor: what two
// webhook calls cost a pod CREATE on this machine when the server is Go's net/http, as KAI's webhook is. It decodes
// every review whole, as a typed webhook would, and answers `allowed: true` with the request's uid. HTTP/1.1 only,
// like gunicorn, so the protocol is the same as gpufrac's.
//
//	bench-go-noop CERTS_DIR HOST:PORT
package main

import (
	"crypto/tls"
	"encoding/json"
	"log"
	"net/http"
	"os"
)

func answer(w http.ResponseWriter, r *http.Request) {
	var review map[string]any
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	request, _ := review["request"].(map[string]any)
	uid, _ := request["uid"].(string)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"response": map[string]any{"uid": uid, "allowed": true},
	})
}

func main() {
	if len(os.Args) != 3 {
		log.Fatal("usage: bench-go-noop CERTS_DIR HOST:PORT")
	}
	certs := os.Args[1]
	mux := http.NewServeMux()
	mux.HandleFunc("/mutate", answer)
	mux.HandleFunc("/validate", answer)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"status":"ready"}`)) })
	server := &http.Server{
		Addr:         os.Args[2],
		Handler:      mux,
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}, // no HTTP/2
	}
	log.Fatal(server.ListenAndServeTLS(certs+"/tls.crt", certs+"/tls.key"))
}
