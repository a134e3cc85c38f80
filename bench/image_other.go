//go:build !linux

package bench

// ImageDefaultPeer is the peer of the image create figure that starts
// the same program from the default (host-derived) root.
const ImageDefaultPeer = "default root"

// ImageCreateFigure measures creating a sandbox from an image; airlock
// sandboxes need Linux.
func ImageCreateFigure(scratch string, runs int) Figure {
	return Unavailable("create from an image (in-process)", "airlock sandboxes need Linux")
}

// GVisorImageCreateFigure is ImageCreateFigure under gVisor; Linux only.
func GVisorImageCreateFigure(scratch string, runs int) Figure {
	return Unavailable("gvisor create from an image (in-process)", "airlock sandboxes need Linux")
}

// gvisorImagePeer needs Linux.
func (s *apiServer) gvisorImagePeer(exe string) Peer {
	return Peer{Name: GVisorImagePeer, Missing: "image roots need Linux"}
}

// ImagePeer is the airlock peer of native sandboxes from an image.
const ImagePeer = Reference + " image"

// nativeImagePeer needs Linux.
func (s *apiServer) nativeImagePeer(exe string) Peer {
	return Peer{Name: ImagePeer, Missing: "image roots need Linux"}
}
